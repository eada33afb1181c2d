"""icml26: working implementations and CPU-scale reproductions of nineteen ICML 2026 papers.

Each paper lives in ``icml26.<slug>`` (``icml26 list`` prints them). Importing ``icml26`` is cheap: it
loads no torch, flwr, ray, transformers or trl. Sub-packages are imported lazily on first attribute access
(PEP 562), so ``icml26.shampoo`` works after a bare ``import icml26``.

Example:
    >>> import icml26
    >>> icml26.__version__
    '0.1.0'
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# A paper imported without its extra names the extra to install (common.optional's finder, last on meta_path).
from .common.optional import install_import_hints

install_import_hints()

# Sub-packages reachable as attributes; each is imported only when first touched.
_SUBMODULES = frozenset(
    {
        "cli",
        "common",
        "registry",
        "runner",
        "report",
        "air",
        "fedit",
        "audio_watermark",
        "moda",
        "shampoo",
        "branch_and_cut",
        "gcpa",
        "xfedalign",
        "regret_po",
        "align_ti",
        "sarl",
        "float_networks",
        "inverse_optimization",
        "coca",
        "fedtreelora",
        "spard",
        "ps_ppo",
        "vq_rank",
        "unsafe_moe",
    }
)

__all__ = ["__version__", *sorted(_SUBMODULES)]


def __getattr__(name: str) -> Any:
    """Import ``icml26.<name>`` on first access (PEP 562)."""
    if name in _SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES)
