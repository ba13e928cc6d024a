"""Models of the index cell."""
__all__: list[str] = []
