"""``icml26.air.manifest``: tool manifests (:mod:`icml26.air.policy.manifest`) and the entity extraction they use
(:mod:`icml26.air.core.entities`).

Kept for the path documented before AIR was split into layers (README); it only re-exports, and no AIR
module imports it.
"""

from __future__ import annotations

from .core.entities import entities, named_entities
from .core.text import canonical_amount
from .policy.manifest import (
    AGENTDOJO,
    EFFECT_INTENT,
    EFFECTS,
    EMBEDDED,
    Inverse,
    Manifest,
    ToolSpec,
    agentdojo_manifest,
)

__all__ = [
    "AGENTDOJO",
    "EFFECTS",
    "EFFECT_INTENT",
    "EMBEDDED",
    "Inverse",
    "Manifest",
    "ToolSpec",
    "agentdojo_manifest",
    "canonical_amount",
    "entities",
    "named_entities",
]
