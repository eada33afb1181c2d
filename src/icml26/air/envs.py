"""``icml26.air.envs``: the embedded agent environments and their scenarios (:mod:`icml26.air.worlds.embedded`).

Kept for the path documented before AIR was split into layers (README): every name is looked up in the
layer module that defines it (PEP 562), so nothing is listed twice; no AIR module imports this one.
"""

from __future__ import annotations

from .core.compat import forward
from .worlds import embedded as _embedded

__getattr__ = forward(__name__, _embedded)
