"""Seeding, thread settings and environment metadata for reproducible runs.

Example:
    >>> rng = seed_everything(0)
    >>> float(rng.random()) == float(seed_everything(0).random())
    True
    >>> {'python', 'torch', 'git_sha'} <= set(environment())
    True
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import random
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
)


def seed_everything(seed: int, *, torch: bool = True) -> np.random.Generator:
    """Seed Python's ``random``, NumPy's legacy global RNG and (by default) torch; return a fresh Generator.

    Args:
        seed: a non-negative integer.
        torch: also seed torch (imports it).

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
    if torch:
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
    else:
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


def git_revision(cwd: str | os.PathLike[str] | None = None) -> tuple[str | None, bool | None]:
    """``(sha, dirty)`` of the git checkout at ``cwd`` (default: this package's source tree), or ``(None, None)``."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return sha or None, bool(status.strip())


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    """Installed versions of ``names`` (absent packages are left out), read without importing them."""
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def environment() -> dict[str, Any]:
    """Metadata stored with every result: Python, package versions, git sha, CPU, threads."""
    sha, dirty = git_revision()
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
        "git_sha": sha,
        "git_dirty": dirty,
    }
