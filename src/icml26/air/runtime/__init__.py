"""AIR's fourth layer, runtime: the responder in the agent loop and what it runs on.

- ``responder``: :class:`IncidentResponder` (hooks, detection, containment, direct and guided recovery,
  verification; eradication through a synthesizer and validator it is given);
- ``state``: state providers (:class:`DictState`, :class:`DeferredView`) and the state diff;
- ``context``: ``ctx`` as rules read it;
- ``containment``: an incident's pre-action view, the rule that blocks similar calls, :func:`replay`;
- ``llm``: LLM clients and the ``semantic(...)`` backends (imported on use).
"""

from __future__ import annotations

from .containment import pre_action_safe, replay
from .context import Context
from .responder import MAX_VALUE_NESTING, IncidentResponder, nesting_depth
from .state import DeferredView, DictState, StateProvider, diff

__all__ = [
    "MAX_VALUE_NESTING",
    "Context",
    "DeferredView",
    "DictState",
    "IncidentResponder",
    "StateProvider",
    "diff",
    "nesting_depth",
    "pre_action_safe",
    "replay",
]
