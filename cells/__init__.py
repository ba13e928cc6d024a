"""The runs, index and streams cells: models, services and their admin."""
