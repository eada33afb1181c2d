"""Seeding, thread settings and environment metadata for reproducible runs.

Example:
    >>> rng = seed_everything(0)
    >>> float(rng.random()) == float(seed_everything(0).random())
    True
    >>> {'python', 'torch', 'git_sha'} <= set(environment())
    True
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: packages whose versions go into every result's ``env`` (only those installed are listed)
TRACKED_PACKAGES = (
    "icml26", "numpy", "scipy", "scikit-learn", "torch", "matplotlib", "tqdm",
    "flwr", "ray", "transformers", "tokenizers", "trl", "peft", "accelerate", "datasets",
    "pydantic", "lark", "langchain", "langgraph", "mcp", "pettingzoo", "gymnasium",
    "vector-quantize-pytorch", "igraph", "leidenalg", "networkx", "pytorch-optimizer", "highspy", "cca-zoo",
    "pyscipopt", "captum", "torchrl", "tensordict", "concept-erasure", "google-re2", "agentdojo", "bluesky-simulator",
    "safetensors", "langchain-core", "pettingzoo",
)


def seed_everything(seed: int, *, torch: bool = True) -> np.random.Generator:
    """Seed Python's ``random``, NumPy's legacy global RNG and (by default) torch; return a fresh Generator.

    Args:
        seed: a non-negative integer.
        torch: also seed torch (imports it, when it is installed: the torch-free papers run without it).

    Returns:
        ``np.random.default_rng(seed)``, the generator experiments should draw from.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002  (third-party code may still read the legacy global RNG)
    if torch and importlib.util.find_spec("torch") is not None:
        import torch as _torch

        _torch.manual_seed(seed)
    return np.random.default_rng(seed)


def set_threads(n: int = 1) -> int:
    """Use ``n`` intra-op threads in torch and in the BLAS pools (threadpoolctl). Returns ``n``.

    One thread is the default on the project's 2-core machine: two threads on a busy machine were several
    times slower in measurements.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    elif importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(n)
    try:  # BLAS pools already loaded by NumPy/SciPy ignore the variables above
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        pass
    return n


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: where code lives: a change under these paths (but not to a Markdown file) makes a checkout "dirty"
CODE_PATHS = ("src", "pyproject.toml")


def git_revision(cwd: str | os.PathLike[str] | None = None) -> tuple[str | None, bool | None]:
    """``(sha, dirty)`` of the git checkout at ``cwd`` (default: this package's source tree), or ``(None, None)``.

    ``dirty`` is whether code differs from the commit: a tracked or new file under ``src/`` or
    ``pyproject.toml`` (Markdown files and ``results/`` do not count; see ``dirty_files``).
    """
    sha, files = git_state(cwd)
    return sha, (None if files is None else bool(files))


def git_state(cwd: str | os.PathLike[str] | None = None) -> tuple[str | None, list[str] | None]:
    """``(sha, dirty_files)``: the commit and the code files that differ from it (``None`` outside git)."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=where, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        if cwd is None and (Path(top) / "src" / "icml26").resolve() != Path(__file__).resolve().parents[1]:
            # installed (a wheel) inside someone else's repository: that commit is not icml26's source
            return None, None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS],
                                cwd=top, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    files = [line[3:].split(" -> ")[-1] for line in status.splitlines() if line.strip()]
    return sha or None, sorted(f for f in files if not f.endswith(".md"))


#: common modules that only report, draw or write what was measured: they never change a number
_REPORTING_MODULES = frozenset({"claims", "results", "io", "optional", "plotting", "progress", "__init__"})
_COMMON_IMPORT = re.compile(r"from\s+(?:\.\.+|icml26\.)common(?:\.(\w+))?\s+import\s+\(?([\w, \n]+)")
_SIBLING_IMPORT = re.compile(r"from\s+\.(\w+)\s+import")  # inside common/


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_files(slug: str, package_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """The files whose content decides a paper's numbers: its folder and the ``common`` modules it imports.

    The paper folder contributes every file but its ``README.md``, its card (recorded on its own) and caches; ``common`` modules follow
    imports transitively, leaving out those that only report (claims, results, io, plotting, progress,
    optional), and bring the ``common/data`` files they name.
    """
    pkg = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parents[1]
    folder = pkg / slug
    if not folder.is_dir():
        raise ValueError(f"no paper folder {folder}")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and p.name not in ("README.md", "paper.toml") and p.suffix not in (".pyc", ".png"))
    common = pkg / "common"
    todo = [p for p in files if p.suffix == ".py"]
    seen: set[str] = set()
    while todo:
        path = todo.pop()
        text = path.read_text(encoding="utf-8")
        names: set[str] = set()
        for m in _COMMON_IMPORT.finditer(text):
            names.update([m.group(1)] if m.group(1) else (n.strip() for n in m.group(2).split(",")))
        if path.parent == common:
            names.update(_SIBLING_IMPORT.findall(text))
        for name in sorted(n for n in names if n):
            module = common / f"{name}.py"
            if name in seen or name in _REPORTING_MODULES or not module.is_file():
                continue
            seen.add(name)
            files.append(module)
            todo.append(module)
            module_text = module.read_text(encoding="utf-8")
            files += sorted(d for d in (common / "data").glob("*") if d.is_file() and d.name in module_text)
    return files


def provenance(slug: str, card: str | os.PathLike[str], package_dir: str | os.PathLike[str] | None = None
               ) -> dict[str, Any]:
    """``{"card_sha256", "sources": {path relative to the package: sha256}}`` for a paper's result."""
    pkg = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parents[1]
    return {"card_sha256": _sha256(Path(card)),
            "sources": {p.relative_to(pkg).as_posix(): _sha256(p) for p in source_files(slug, pkg)}}


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    """Installed versions of ``names`` (absent packages are left out), read without importing them."""
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def source_digest(package_dir: str | os.PathLike[str] | None = None) -> str:
    """sha256 over the installed icml26 package's code and cards (relative path and content of every ``.py``,
    ``.toml`` and data file, sorted): which icml26 made a number, installed from git or from a wheel."""
    pkg = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and p.suffix not in (".pyc", ".md", ".png")):
        digest.update(path.relative_to(pkg).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def environment() -> dict[str, Any]:
    """Metadata stored with every result: Python, package versions, icml26's source digest, git sha (of the
    icml26 checkout only), CPU, threads."""
    sha, dirty_files = git_state()
    threads: int | None = None
    if "torch" in sys.modules:
        threads = int(sys.modules["torch"].get_num_threads())
    versions = package_versions()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "numpy": versions.get("numpy"),
        "torch": versions.get("torch"),
        "packages": versions,
        "icml26_source_digest": source_digest(),
        "git_sha": sha,
        "git_dirty": None if dirty_files is None else bool(dirty_files),
        "git_dirty_files": dirty_files,
    }
