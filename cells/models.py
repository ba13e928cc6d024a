"""Models of the runs, index and streams cells (imported from their modules)."""
