"""Matplotlib on the Agg backend; figures saved atomically as PNG.

Example:
    >>> import tempfile, pathlib
    >>> fig, ax = new_figure()
    >>> _ = ax.plot([0, 1], [1, 0])
    >>> out = save_figure(fig, pathlib.Path(tempfile.mkdtemp()) / "demo.png")
    >>> out.suffix
    '.png'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .io import atomic_write_with


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None, **kwargs: Any):
    """Return ``(fig, axes)`` from ``plt.subplots`` on the Agg backend."""
    plt = _pyplot()
    if figsize is None:
        figsize = (4.5 * ncols, 3.4 * nrows)
    return plt.subplots(nrows, ncols, figsize=figsize, **kwargs)


def save_figure(fig, path: str | os.PathLike[str], *, dpi: int = 120) -> Path:
    """Save ``fig`` as PNG at ``path`` atomically and close it. Returns the path."""
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise ValueError(f"path must end in .png, got {str(target)!r}")
    fig.tight_layout()
    atomic_write_with(target, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
    _pyplot().close(fig)
    return target
