"""Models of the streams cell."""
__all__: list[str] = []
