"""The one cache of the labs' trained models (``tiny_lm.cached``, ``tiny_vlm.cached_vlm``) and of small JSON results.

An entry lives at ``cache_dir() / namespace / digest`` where ``digest`` hashes the key (everything that determines
what is cached), the icml26 version and a digest of the code that builds it (``code_digest``: every source file of
``common/`` and of the package that defines the build function), so an edit to the training code misses the old
entries instead of loading a model the new code would not train. A fault costs a rebuild, never a crash and never a half-written entry:

- **atomic writes**: a model is saved into a fresh ``.tmp-*`` directory beside its entry, every file and the
  directory are fsynced, a manifest (sha256 of every file) is written last, then the directory is renamed onto the
  entry with ``os.replace``; a JSON entry goes through ``io.atomic_open`` (temp file, fsync, ``os.replace``).
  A build or save that raises leaves no temp behind; temps orphaned by a killed process are swept after an hour.
- **concurrent writers**: both build, the first rename wins, the second finds a complete entry and loads it.
- **verification on every load**: a directory entry must match its manifest (no file missing, added, truncated or
  overwritten) and hold no pickle file (``*.bin``, ``*.pt``, ...); models load through safetensors
  (``save_pretrained``'s format) and bare tensor files only with ``torch.load(..., weights_only=True)``
  (``load_tensors``), so nothing in the cache is ever unpickled.
- **healing**: an entry that fails verification or loading (truncated, garbage, half-written by an older
  version) is removed with a ``CacheWarning`` naming it and rebuilt once.
- **read-only cache**: when the entry cannot be written, the build is saved to a scratch directory and loaded
  from there (the same save/load path, so the same numbers), with a warning, and the run goes on uncached.
- **permissions**: entries get what a plain ``open`` / ``mkdir`` gives (the umask's), not ``mkstemp``'s 0600.

Example:
    >>> import os, tempfile
    >>> os.environ["ICML26_CACHE"] = tempfile.mkdtemp()
    >>> cached_json("demo", {"x": 1}, lambda: {"y": 2})
    {'y': 2}
    >>> cached_json("demo", {"x": 1}, lambda: {"y": 3})  # a hit: not recomputed
    {'y': 2}
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .io import atomic_open

T = TypeVar("T")

MANIFEST = "icml26_manifest.json"
"""the file written last into a directory entry: ``{"files": {relative path: sha256}}``"""
KEY_FILE = "icml26_key.json"
"""the key an entry was built from, for a reader of the cache"""
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
"""files a directory entry may not hold: the cache never unpickles"""
STALE_TMP_S = 3600.0
"""age after which a ``.tmp-*`` left by a killed writer is removed"""


class CacheWarning(UserWarning):
    """A cache entry was unreadable and is rebuilt, or the cache is not writable and the run goes on uncached."""


class CorruptEntry(Exception):
    """A cache entry failed verification."""


def cache_dir() -> Path:
    """``$ICML26_CACHE`` or ``~/.cache/icml26``."""
    return Path(os.environ.get("ICML26_CACHE", Path.home() / ".cache" / "icml26"))


@functools.cache
def _tree_digest(directory: str) -> str:
    """sha256 of every ``*.py`` file under ``directory`` (relative path and bytes, sorted)."""
    h = hashlib.sha256()
    root = Path(directory)
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def code_digest(fn: Callable[..., Any]) -> str:
    """16 hex digits naming the code behind ``fn``: all of ``icml26/common`` and, when ``fn`` is defined in a paper
    package ``icml26.<slug>``, every file of that package (otherwise the one file that defines ``fn``).

    Coarse on purpose: any edit to the lab or to the paper invalidates the paper's entries (a rebuild costs
    minutes; a stale model costs a wrong number).
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = inspect.unwrap(fn)
    module_name = getattr(fn, "__module__", None) or ""
    common = Path(__file__).resolve().parent
    parts = [_tree_digest(str(common))]
    if module_name.startswith("icml26."):
        if module_name.split(".")[1] != "common":
            parts.append(_tree_digest(str(common.parent / module_name.split(".")[1])))
    else:
        source = getattr(sys.modules.get(module_name), "__file__", None)
        if source and Path(source).is_file():
            parts.append(hashlib.sha256(Path(source).read_bytes()).hexdigest())
    return hashlib.sha256("".join(parts).encode()).hexdigest()[:16]


def key_digest(key: dict[str, Any], code: Callable[..., Any] | None = None) -> str:
    """20 hex digits of the sha256 of ``key``, the icml26 version and ``code_digest(code)`` (JSON, sorted keys)."""
    from .. import __version__

    full = {**key, "icml26": __version__}
    if code is not None:
        full["code"] = code_digest(code)
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _warn(msg: str) -> None:
    warnings.warn(f"icml26 cache: {msg}", CacheWarning, stacklevel=3)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    """fsync a file or a directory (a no-op where the file system cannot fsync a directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _files(entry: Path) -> list[Path]:
    return sorted(p for p in entry.rglob("*") if p.is_file() or p.is_symlink())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _seal(entry: Path) -> None:
    """Give every file of ``entry`` a plain ``open``'s permissions (savers may use ``mkstemp``'s 0600), fsync it,
    write the manifest last, fsync the directories."""
    mask = _umask()
    for d in [entry, *(p for p in entry.rglob("*") if p.is_dir() and not p.is_symlink())]:
        os.chmod(d, 0o777 & ~mask)
    files = {}
    for p in _files(entry):
        if not p.is_symlink():
            os.chmod(p, 0o666 & ~mask)
        _fsync(p)
        files[p.relative_to(entry).as_posix()] = _sha256(p)
    with open(entry / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump({"files": files}, fh, sort_keys=True, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    for d in sorted({p.parent for p in _files(entry)}, key=lambda d: len(d.parts), reverse=True):
        _fsync(d)


def verify_entry(entry: Path) -> None:
    """Raise ``CorruptEntry`` unless ``entry`` is a directory that matches its manifest and holds no pickle file.

    An entry without a manifest (written before manifests existed) is left to its loader's own checks.
    """
    if entry.is_symlink() or not entry.is_dir():
        raise CorruptEntry(f"{entry} is not a directory")
    present = {p.relative_to(entry).as_posix(): p for p in _files(entry)}
    pickles = sorted(n for n in present if n.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise CorruptEntry(f"{entry} holds pickle files {pickles}, which the cache never loads")
    if MANIFEST not in present:
        return
    try:
        expected = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CorruptEntry(f"{entry}: unreadable manifest ({err})") from err
    del present[MANIFEST]
    if set(expected) != set(present):
        raise CorruptEntry(f"{entry}: files {sorted(set(expected) ^ set(present))} differ from its manifest")
    for name, digest in expected.items():
        if present[name].is_symlink() or _sha256(present[name]) != digest:
            raise CorruptEntry(f"{entry}: {name} does not match its manifest (truncated or overwritten)")


def _remove(path: Path) -> None:
    """Remove an entry or a temp (renamed aside first, so no reader meets a half-deleted entry)."""
    aside = path.with_name(f".tmp-dead-{uuid.uuid4().hex}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return
    except OSError:
        aside = path
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            aside.unlink()


def _sweep(parent: Path) -> None:
    """Remove the ``.tmp-*`` that killed writers left in ``parent`` (older than ``STALE_TMP_S``)."""
    now = time.time()
    for p in parent.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            if now - p.lstat().st_mtime > STALE_TMP_S:
                _remove(p)


def cached_entry(namespace: str, key: dict[str, Any], build: Callable[[], T], *, save: Callable[[T, Path], Any],
                 load: Callable[[Path], T]) -> T:
    """``load`` of the directory entry keyed by ``key``; on a miss ``build()``, ``save`` atomically, then ``load``.

    The value returned on a miss is always the reloaded one (never ``build()``'s object), so a hit and a miss give
    the same model. Faults: see the module docstring.

    Args:
        namespace: the entries' folder under ``cache_dir()`` (``"tiny_lm"``, ``"tiny_vlm"``).
        key: everything that determines the value besides the code (JSON-able; ``str`` for the rest).
        build: makes the value on a miss; its code (``code_digest``) is part of the entry's name.
        save: writes a value into an existing empty directory.
        load: reads a value back from such a directory.
    """
    target = cache_dir() / namespace / key_digest(key, build)
    if target.exists() or target.is_symlink():
        try:
            verify_entry(target)
            return load(target)
        except Exception as err:
            _warn(f"removing and rebuilding the unreadable entry {target} ({type(err).__name__}: {err})")
            _remove(target)
    value = build()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _sweep(target.parent)
        tmp = target.parent / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
    except OSError as err:
        _warn(f"{target.parent} is not writable ({err}); running uncached")
        with tempfile.TemporaryDirectory(prefix="icml26-uncached-") as scratch:
            save(value, Path(scratch))
            return load(Path(scratch))
    try:
        save(value, tmp)
        (tmp / KEY_FILE).write_text(json.dumps(key, sort_keys=True, default=str, indent=2), encoding="utf-8")
        _seal(tmp)
        try:
            os.replace(tmp, target)
        except OSError as err:
            if not target.is_dir():  # not another writer's finished entry: this run uses its own copy
                _warn(f"could not publish {target} ({err}); running uncached")
                return load(tmp)
        else:
            _fsync(target.parent)
        verify_entry(target)
        return load(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def cached_json(namespace: str, key: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()``'s dict, cached in ``cache_dir() / namespace / <key_digest>.json`` as ``{"key": key, **value}``.

    An unreadable file (truncated, garbage, not a JSON object) is replaced with a warning; writes are atomic; a
    read-only cache runs uncached.
    """
    path = cache_dir() / namespace / f"{key_digest(key, compute)}.json"
    if path.exists() or path.is_symlink():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(stored, dict):
                raise CorruptEntry("not a JSON object")
            return {k: v for k, v in stored.items() if k != "key"}
        except Exception as err:
            _warn(f"removing and recomputing the unreadable entry {path} ({type(err).__name__}: {err})")
            _remove(path)
    value = compute()
    try:
        with atomic_open(path, "w") as fh:
            fh.write(json.dumps({"key": key, **value}, sort_keys=True, indent=2, default=str))
        _fsync(path.parent)
    except OSError as err:
        _warn(f"could not write {path} ({err}); running uncached")
    return value


def load_tensors(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Tensors of a ``.safetensors`` file, or of a ``torch.save`` file with ``weights_only=True`` (a pickled
    object that is not plain tensors and containers is refused with ``pickle.UnpicklingError``, never run)."""
    import torch

    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)
