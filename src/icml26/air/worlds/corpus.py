"""AIR's worlds layer, benign corpora: pre-action traces of benign runs, for eradication's validator."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.records import TraceStep
from ..dsl import RuleSet
from ..policy.manifest import EMBEDDED, agentdojo_manifest
from ..runtime.responder import IncidentResponder
from ..runtime.state import DictState
from .embedded import scenarios
from .episodes import run_episode


def benign_corpus(agent_types: Sequence[str] = ("shell", "email", "household"),
                  suites: Sequence[str] = ("banking", "slack", "workspace", "travel")) -> list[list[TraceStep]]:
    """A benign validation corpus for eradication: the pre-action traces of every benign twin of the embedded
    worlds (all variants) and of every AgentDojo user task of ``suites`` run without an injection, each recorded
    by a rule-less responder with the world's tool manifest (so ``call.effects``/``targets`` are bound as at
    runtime). Deterministic; AgentDojo suites need the ``agentdojo`` package.

    Example:
        >>> traces = benign_corpus(("household",), suites=())
        >>> len(traces) > 0 and all(isinstance(s, TraceStep) for t in traces for s in t)
        True
    """
    import numpy as np

    out: list[list[TraceStep]] = []
    rng = np.random.default_rng(0)
    for t in agent_types:
        air = IncidentResponder(RuleSet(), DictState(dict), manifest=EMBEDDED[t])
        for s in scenarios(t):
            if s.benign:
                run_episode(s, air, rng, 0.0)
                out.append(list(air.trace))
    if suites:
        from agentdojo.task_suite.load_suites import get_suite

        from ..integrations.agentdojo import BENCHMARK_VERSION, _fast_yaml
        from .agentdojo import ScriptedCompromisedAgent, benign_traces_of

        _fast_yaml()
        agent = ScriptedCompromisedAgent()
        for name in suites:
            suite = get_suite(BENCHMARK_VERSION, name)
            out += benign_traces_of(suite, agentdojo_manifest(name), suite.user_tasks, agent)
    return out
