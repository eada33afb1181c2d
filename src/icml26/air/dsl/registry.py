"""AIR's dsl layer, the predicate registry: the Python predicates rule files may call (registered in code)."""

from __future__ import annotations

import re
from collections.abc import Callable

_PREDICATES: dict[str, Callable[..., bool]] = {}


def predicate(name: str) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    """Register a Python predicate under ``name`` (rule files call it; they never contain code).

    Example:
        >>> @predicate("is_even")
        ... def _is_even(x):
        ...     return x % 2 == 0
        >>> "is_even" in registered_predicates()
        True
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name in ("semantic", "not", "and", "or"):
        raise ValueError(f"invalid predicate name {name!r}")

    def register(fn: Callable[..., bool]) -> Callable[..., bool]:
        _PREDICATES[name] = fn
        return fn

    return register


def registered_predicates() -> dict[str, Callable[..., bool]]:
    return dict(_PREDICATES)
