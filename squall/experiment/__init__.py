"""Running cells: a lab (cluster + shaping + one run), the timeline, matrices, the session runner."""
