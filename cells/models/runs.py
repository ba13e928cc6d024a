"""Models of the runs cell."""
__all__: list[str] = []
