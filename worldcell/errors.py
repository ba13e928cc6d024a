"""Errors a cell method may raise, and how the RPC route reports them (docs/protocol.md §2.8–2.9).

* ``ValidationError`` — the arguments do not fit the method's schema. The route
  answers **400** ``{"error":{"name":"ValidationError","message":…}}`` (worldcell's
  deliberate deviation from upstream's 500 ``ZodError``). Raised before
  anything is written, or inside the cell's transaction so everything rolls back.
* ``CellError`` — a raised upstream error that the client must see as **500**
  with a specific ``name``/``message`` (e.g. ``Cannot write to a closed stream``).
  ``status`` (optional int) is echoed as the numeric ``status`` member.
"""
from __future__ import annotations


class CellError(Exception):
    """A method failure reported as HTTP 500 ``{"error":{name, message, status?}}``.

    Args:
        message: the error text sent as ``error.message``.
        name: the error name sent as ``error.name`` (default ``"Error"``).
        status: optional numeric ``error.status`` member.
    """

    http_status = 500

    def __init__(self, message: str, *, name: str = "Error", status: int | None = None):
        super().__init__(message)
        self.message = message
        self.name = name
        self.status = status


class ValidationError(CellError):
    """Arguments that fail a method's schema: HTTP 400 ``ValidationError``.

    ``message`` says which field failed and why, e.g. ``data.correlationId: required``.
    """

    http_status = 400

    def __init__(self, message: str):
        super().__init__(message, name="ValidationError")
