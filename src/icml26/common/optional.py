"""Optional dependencies: found, not assumed.

A paper that needs an extra calls ``requires`` inside the function that uses it, so ``import icml26`` stays
cheap and a missing extra gives an error that names what to install, never a silent fallback.

Example:
    >>> has("math")
    True
    >>> requires("math", extra="core").sqrt(4.0)
    2.0
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
from types import ModuleType


class MissingExtraError(ImportError):
    """An optional dependency is absent; the message names the extra that brings it."""


class MissingSystemToolError(RuntimeError):
    """A system program (a Debian package) is absent; the message says how to install it."""


def has(module: str) -> bool:
    """True if ``module`` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install_hint(extra: str) -> str:
    """The pip command that installs ``extra``."""
    return f'pip install "icml26[{extra}]"'


def requires(module: str, *, extra: str, purpose: str | None = None) -> ModuleType:
    """Import and return ``module``, or raise ``MissingExtraError`` naming ``extra``.

    Args:
        module: importable module name, e.g. ``"flwr"``.
        extra: the icml26 extra that provides it, e.g. ``"fl"``.
        purpose: optional words on what needs it, for the message.
    """
    if not has(module):
        what = f" (needed for {purpose})" if purpose else ""
        raise MissingExtraError(
            f"optional dependency {module!r} is not installed{what}; install it with: {install_hint(extra)}"
        )
    return importlib.import_module(module)


def require_program(program: str, *, apt: str | None = None, purpose: str | None = None) -> str:
    """Return the path of ``program`` on PATH, or raise ``MissingSystemToolError`` saying how to get it."""
    path = shutil.which(program)
    if path is None:
        what = f" (needed for {purpose})" if purpose else ""
        how = f"; install it with: apt-get install -y {apt or program}" if apt or program else ""
        raise MissingSystemToolError(f"system program {program!r} was not found on PATH{what}{how}")
    return path
