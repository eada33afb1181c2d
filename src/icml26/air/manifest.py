"""``icml26.air.manifest``: tool manifests (:mod:`icml26.air.policy.manifest`) and the entity extraction they use
(:mod:`icml26.air.core.entities`, :func:`icml26.air.core.text.canonical_amount`).

Kept for the path documented before AIR was split into layers (README): every name is looked up in the
layer module that defines it (PEP 562), so nothing is listed twice; no AIR module imports this one.
"""

from __future__ import annotations

from .core import entities as _entities
from .core import text as _text
from .core.compat import forward
from .policy import manifest as _manifest

__getattr__ = forward(__name__, _manifest, _entities, _text)
