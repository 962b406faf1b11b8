"""What this kernel can do, tried in a throw-away namespace: a backend's leaf qdisc, ``squall doctor``'s features."""
