"""AIR's third layer, policy: what tools do and the rules written over it.

- ``manifest``: tool manifests (effect classes, targets, content, resources, inverse operations; the AgentDojo
  suites' and the embedded environments');
- ``predicates``: the whitelisted predicates rule files may call (imported here, so they are registered);
- ``prevention``: the prevention posture (irreversible classes, known parties, intent per class, the shell's
  command classes, the posture's manifests);
- ``rules``: the rule files shipped in ``air/rules/`` (:func:`builtin_rules`), the generic ones among them.
"""

from __future__ import annotations

from . import manifest, predicates, prevention
from .manifest import *  # noqa: F403 (the names listed in manifest.__all__)
from .rules import builtin_rules

__all__ = [*manifest.__all__, "builtin_rules", "predicates", "prevention"]
