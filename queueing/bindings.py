"""Registers the queue cell service with ``worldcell.dispatch``."""
