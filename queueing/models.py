"""Models of the queue cells."""
