"""Progress bars (tqdm) that turn themselves off when stderr is not a terminal.

Set ``ICML26_PROGRESS=1`` to force bars on, ``ICML26_PROGRESS=0`` to force them off.

Example:
    >>> total = sum(progress(range(3), desc="demo"))
    >>> total
    3
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def progress_enabled() -> bool:
    """True when bars should be drawn: forced by ``ICML26_PROGRESS`` or stderr is a TTY."""
    forced = os.environ.get("ICML26_PROGRESS")
    if forced is not None:
        return forced.strip().lower() not in ("0", "false", "no", "")
    return sys.stderr.isatty()


def progress(iterable: Iterable[T] | None = None, *, total: int | None = None, desc: str | None = None,
             leave: bool = False, **kwargs: Any):
    """Wrap ``iterable`` in a tqdm bar that is disabled when output is not a terminal.

    Args:
        iterable: what to iterate over (``None`` for a manual bar driven by ``update``).
        total: number of steps, when ``iterable`` has no length.
        desc: label shown left of the bar.
        leave: keep the bar on screen when done.
        **kwargs: passed to ``tqdm.tqdm``.
    """
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, leave=leave, disable=not progress_enabled(),
                dynamic_ncols=True, **kwargs)
