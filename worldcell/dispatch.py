"""The dispatch table: binding -> cell service -> whitelisted wire methods (docs/protocol.md §2.5).

Each Django app registers its bindings in ``AppConfig.ready()``::

    register_binding("runs", RunCell, {"applyEvent": "apply_event", ...})

``factory(name, tenant=…)`` builds the cell service for a decoded cell name of one tenant; the mapping
lists the wire method names that may be dispatched and the Python attribute
each one calls. Anything not registered is a 404 ``unknown method`` (or
``unknown binding``) — ``constructor``, ``alarm``, ``fetch`` and private names
can never be reached because only mapped names are looked up.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .tenancy import DEFAULT_TENANT

#: The four bindings of docs/protocol.md §1.2 and the whitelist of §2.5. A binding
#: outside this table is a 404 ``unknown binding`` even before registration.
KNOWN_BINDINGS: Mapping[str, frozenset[str]] = {
    "runs": frozenset(
        {"applyEvent", "getRun", "getStep", "getEvent", "listEvents", "listSteps", "listHooks"}
    ),
    "streams": frozenset(
        {"writeChunk", "closeStream", "getChunks", "getInfo", "registerStream", "listStreams"}
    ),
    "index": frozenset(
        {
            "get",
            "put",
            "delete",
            "list",
            "reserveHookToken",
            "finalizeHookIndexes",
            "releaseHookToken",
            "deleteHookIndexes",
        }
    ),
    "queue": frozenset(
        {"enqueue", "stats", "listDeadLetters", "redriveDeadLetter", "purgeDeadLetters", "rearmAlarm"}
    ),
}


@dataclass(frozen=True)
class Binding:
    """One registered binding: how to build a cell and which methods it serves."""

    name: str
    factory: Callable[[str], Any]
    methods: Mapping[str, str]
    arity: dict[str, int] = field(default_factory=dict)


_REGISTRY: dict[str, Binding] = {}


def register_binding(name: str, factory: Callable[[str], Any], methods: Mapping[str, str]) -> None:
    """Register ``factory`` as the service of binding ``name``.

    Args:
        name: one of ``KNOWN_BINDINGS``.
        factory: ``factory(cell_name: str, tenant: str) -> service``.
        methods: wire method name -> attribute name on the service; every key
            must be in that binding's whitelist.

    Raises ValueError for an unknown binding or a method outside the whitelist.
    """
    allowed = KNOWN_BINDINGS.get(name)
    if allowed is None:
        raise ValueError(f"unknown binding {name!r}")
    extra = set(methods) - allowed
    if extra:
        raise ValueError(f"methods not in the {name} whitelist: {sorted(extra)}")
    arity = {}
    for wire, attr in methods.items():
        fn = getattr(factory, attr)
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
        ]
        arity[wire] = len(params)
    _REGISTRY[name] = Binding(name, factory, dict(methods), arity)


def registered() -> dict[str, Binding]:
    """Every registered binding by name (a copy; ``/v1/docs`` is generated from it)."""
    return dict(_REGISTRY)


def lookup(binding: str, method: str) -> Binding | None:
    """The registered binding serving ``binding.method``, or None (-> 404)."""
    b = _REGISTRY.get(binding)
    if b is None or method not in b.methods:
        return None
    return b


def invoke(binding: Binding, cell_name: str, method: str, args: list[Any], tenant: str = DEFAULT_TENANT) -> Any:
    """Call ``method`` on cell ``cell_name`` of ``tenant`` with the positional ``args``.

    The tenant is the caller's (``worldcell.credentials.Identity.tenant``):
    the cell service is built for that tenant's cell and sees no other
    (``worldcell.tenancy``). Missing trailing arguments take the method's
    defaults (absent); extra arguments are ignored (docs/protocol.md §2.6).
    Returns the method's result.
    """
    service = binding.factory(cell_name, tenant=tenant)
    fn = getattr(service, binding.methods[method])
    return fn(*args[: binding.arity[method]])
