"""Registers each cell service of this app with ``worldcell.dispatch``.

Each implemented binding adds one ``register_binding`` call here.
"""
