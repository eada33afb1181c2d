"""``icml26.air.synth``: eradication (:mod:`icml26.air.eradicate`) and the benign corpus its validator is given
(:func:`icml26.air.worlds.corpus.benign_corpus`).

Kept for the path documented before AIR was split into layers (README): every name is looked up in the
layer module that defines it (PEP 562), so nothing is listed twice; no AIR module imports this one.
"""

from __future__ import annotations

from . import eradicate as _eradicate
from .core.compat import forward
from .worlds import corpus as _corpus

__getattr__ = forward(__name__, _eradicate, _corpus)
