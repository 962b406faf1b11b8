"""Training under packet loss (Weintraub, Banner, Orda 2025): sharded SGD over UDP, no retransmission."""
