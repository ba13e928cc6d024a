"""Fixtures of the run-cell tests (``tests/runs/``): the run cell ``run`` over the RPC route."""
from __future__ import annotations

import pytest

from .support import RunClient


@pytest.fixture
def run(rpc) -> RunClient:
    """The run cell ``wrun_test``."""
    return RunClient(rpc, "wrun_test")
