"""``icml26.air.llm``: LLM clients and semantic-check backends (:mod:`icml26.air.runtime.llm`).

Kept for the path documented before AIR was split into layers (README): every name is looked up in the
layer module that defines it (PEP 562), so nothing is listed twice; no AIR module imports this one.
"""

from __future__ import annotations

from .core.compat import forward
from .runtime import llm as _llm

__getattr__ = forward(__name__, _llm)
