"""Atomic file writes: a temp file in the target directory, then ``os.replace``.

Nothing half-written is ever left at the target path: a reader sees either the old file or the new one. The
file gets the permissions a plain ``open`` would give (0666 less the umask), not ``mkstemp``'s 0600. A temp file
that a killed writer (``kill -9``) left beside the target is removed by the next write of that target once it is
older than ``STALE_TMP_S``.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> atomic_write_text(d / "a.txt", "hello")
    >>> (d / "a.txt").read_text()
    'hello'
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

STALE_TMP_S = 3600.0
"""age after which a temp file beside a target is taken to be a killed writer's and removed"""


def _sweep(parent: Path, prefix: str, suffix: str) -> None:
    """Remove ``prefix*suffix`` temp files in ``parent`` older than ``STALE_TMP_S`` (a killed writer's)."""
    now = time.time()
    for p in parent.glob(f"{glob.escape(prefix)}*{glob.escape(suffix)}"):
        with contextlib.suppress(OSError):
            if p.is_file() and now - p.lstat().st_mtime > STALE_TMP_S:
                p.unlink()


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temp file beside ``path``; on success rename it over ``path``, on error delete it.

    Args:
        path: final destination; its parent directory is created if needed.
        mode: ``"w"`` (text) or ``"wb"`` (binary).
        encoding: text encoding (ignored in binary mode).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep(target.parent, f".{target.name}.", ".tmp")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_open(path, "w") as fh:
        fh.write(text)


def atomic_write_with(path: str | os.PathLike[str], writer: Callable[[str], None]) -> None:
    """Let ``writer(tmp_path)`` write a file (e.g. ``fig.savefig``), then move it to ``path`` atomically.

    The temp name keeps ``path``'s suffix so that writers that infer the format from it still work.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep(target.parent, f".{target.stem}.", target.suffix)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    try:
        writer(tmp)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
