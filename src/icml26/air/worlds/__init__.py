"""AIR's seventh layer, worlds: where the responder is exercised, and the benign corpora recorded there.

- ``embedded``: three embedded agent environments (shell, email, household) with incident families, variants and
  benign twins (:func:`scenarios`);
- ``episodes``: a scripted agent running one scenario under a responder (:func:`run_episode`);
- ``agentdojo``: the AgentDojo evaluation protocol (scripted compromised agent, pair runs, built-in attacks),
  driven through the adapter in ``air.integrations.agentdojo`` (needs the ``agents-dojo`` extra; imported on use);
- ``corpus``: :func:`benign_corpus`, the benign validation corpus eradication's validator is given.
"""

from __future__ import annotations

from .corpus import benign_corpus
from .embedded import (
    AGENT_TYPES,
    FAMILIES,
    HELD_OUT,
    EmailEnv,
    Env,
    HouseholdEnv,
    Scenario,
    ShellEnv,
    ToolError,
    scenarios,
)
from .episodes import Episode, run_episode

__all__ = [
    "AGENT_TYPES",
    "FAMILIES",
    "HELD_OUT",
    "EmailEnv",
    "Env",
    "Episode",
    "HouseholdEnv",
    "Scenario",
    "ShellEnv",
    "ToolError",
    "benign_corpus",
    "run_episode",
    "scenarios",
]
