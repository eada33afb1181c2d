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
import importlib.abc
import importlib.util
import shutil
import sys
from types import ModuleType


class MissingExtraError(ImportError):
    """An optional dependency is absent; the message names the extra that brings it."""


class MissingExtraModuleError(MissingExtraError, ModuleNotFoundError):
    """A module that an icml26 paper imports at import time is absent (raised by the import hint finder)."""


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


def _importer_paper() -> str | None:
    """The paper whose ``import`` statement is being executed (``None`` when the importer is not icml26 code, or
    the import comes from ``importlib`` calls such as ``find_spec`` that probe for optional packages)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
        frame = frame.f_back
    if frame is None or not str(frame.f_globals.get("__name__", "")).startswith("icml26."):
        return None
    while frame is not None:  # the nearest paper module on the stack (a common module imported by a paper)
        parts = str(frame.f_globals.get("__name__", "")).split(".")
        if parts[0] == "icml26" and len(parts) > 1 and parts[1] not in _NOT_PAPERS:
            return parts[1]
        frame = frame.f_back
    return ""


#: icml26's own modules that are not papers
_NOT_PAPERS = frozenset({"common", "cli", "registry", "runner", "report", "history", "__main__"})


class _ImportHintFinder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path`` when installed: asked only about a module no earlier finder found (finders that
    libraries append later are asked first). When an icml26 module's own ``import`` statement names a missing
    top-level package, the error names the paper's extra."""

    def find_spec(self, fullname, path=None, target=None):
        if path is not None or fullname == "icml26":
            return None
        slug = _importer_paper()
        if slug is None:
            return None
        later = sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else []
        for finder in later:  # finders added after this one (a library's aliases) answer first
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                return spec
        if slug:
            from ..registry import paper_extra  # only on the error path: the registry reads the cards

            extra = paper_extra(slug)
            how = f"icml26.{slug} needs it; install the paper's extra: {install_hint(extra)} (from a clone: " \
                  f'pip install -e ".[{extra}]")'
        else:
            how = "icml26's shared code needs it for the paper you use; `icml26 info SLUG` names its extra"
        raise MissingExtraModuleError(f"No module named {fullname!r}: {how}", name=fullname)


def install_import_hints() -> None:
    """Put the import-hint finder last on ``sys.meta_path`` (once): ``import icml26.spard`` without torch then
    says which extra to install instead of a bare ``No module named 'torch'``."""
    if not any(isinstance(f, _ImportHintFinder) for f in sys.meta_path):
        sys.meta_path.append(_ImportHintFinder())
