"""AIR's third layer, policy: what tools do and the rules written over it.

- ``manifest``: tool manifests (effect classes, targets, content, resources, inverse operations; the AgentDojo
  suites' and the embedded environments');
- ``predicates``: the whitelisted predicates rule files may call (imported here, so they are registered);
- ``rules``: the rule files shipped in ``air/rules/`` (:func:`builtin_rules`), the generic ones among them.
"""

from __future__ import annotations

from . import predicates
from .manifest import (
    AGENTDOJO,
    EFFECT_INTENT,
    EFFECTS,
    EMBEDDED,
    Inverse,
    Manifest,
    ToolSpec,
    agentdojo_manifest,
)
from .rules import builtin_rules

__all__ = [
    "AGENTDOJO",
    "EFFECTS",
    "EFFECT_INTENT",
    "EMBEDDED",
    "Inverse",
    "Manifest",
    "ToolSpec",
    "agentdojo_manifest",
    "builtin_rules",
    "predicates",
]
