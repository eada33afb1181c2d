"""AIR's core layer: the re-export used by the module paths documented before AIR was split into layers."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any


def forward(module: str, *homes: ModuleType) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` (PEP 562) that finds each name in the first of ``homes`` defining it.

    Args:
        module: the forwarding module's ``__name__`` (for the error).
        homes: the layer modules that define the names, searched in order.

    Returns:
        The function to assign to the forwarding module's ``__getattr__``.

    Example:
        >>> import math
        >>> forward("old", math)("pi") == math.pi
        True
    """
    def __getattr__(name: str) -> Any:
        for home in homes:
            if hasattr(home, name):
                return getattr(home, name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
