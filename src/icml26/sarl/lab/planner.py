"""A non-learned centralised lookahead planner on our own simulator: a ceiling candidate (issue #27), not an arm of
the reproduction (it resolved fewer validation scenarios than ``greedy_kss``: README, Deviation 8).

One step of multi-agent rollout (policy improvement over a base controller, Bertsekas, "Multiagent Rollout
Algorithms and Reinforcement Learning", arXiv 1910.00120): at every decision the base controller ``greedy_kss``
(direct-to when off track, else maintain, through the Kinematic Safety Shield) proposes an instruction for every
aircraft. For the ``max_agents`` aircraft of each scenario with the most urgent predicted conflict, every
instruction the shield allows is tried: the scenario is copied, that aircraft flies the candidate for one decision
while the others fly the base proposal, then everybody flies ``greedy_kss`` for ``horizon - 1`` more decisions;
the copy is scored by the environment's own team reward,

    J(i, a) = sum_{t < horizon} sum_j r_j(t)      (the reward of ``AirspaceCore.step``),

and aircraft i is cleared with ``argmax_a J(i, a)`` if it beats the base proposal's score, else with the base
proposal. The planner sees only what the simulator can predict from the current state (no future spawns, no
evaluation metric); its choices still pass through the shield at inference like every other arm.

Cost per decision: ``(1 + max_agents x 8)`` scenario copies simulated ``horizon`` decisions with the shield.

Example:
    >>> import numpy as np
    >>> from icml26.sarl.env import AirspaceCore
    >>> core = AirspaceCore(n_envs=2, n_aircraft=6, seed=0, scenario="streams", radius_nm=30.0)
    >>> plan = LookaheadPlanner(horizon=2, max_agents=2)
    >>> plan(core).shape
    (2, 6)
"""

from __future__ import annotations

import copy

import numpy as np

from ..env import N_ACTIONS, AirspaceCore
from ..mappo import greedy_direct
from ..shield import KinematicSafetyShield

_BN = (
    "x",
    "y",
    "hdg",
    "spd",
    "cmd_hdg",
    "cmd_spd",
    "nominal",
    "exit_x",
    "exit_y",
    "straight",
    "airborne_s",
    "present",
    "alive",
    "arrived",
    "prev_action",
    "flown",
    "instructions",
    "changes",
    "los_time",
    "overrides",
    "los_events",
    "pair_los",
    "t",
)


def greedy_kss_actions(core: AirspaceCore) -> np.ndarray:
    """The base controller's shielded instructions (B, N)."""
    return KinematicSafetyShield(core).filter(greedy_direct(core))[0]


def replicate(core: AirspaceCore, copies: int) -> AirspaceCore:
    """A core whose env ``b * copies + c`` is a copy of ``core``'s env b (no auto-reset, no metrics kept)."""
    sim = copy.copy(core)
    for k in _BN:
        setattr(sim, k, np.repeat(getattr(core, k), copies, axis=0))
    sim.B = core.B * copies
    sim.auto_reset = False
    sim.finished = []
    return sim


class LookaheadPlanner:
    """Callable ``core -> (B, N)`` instructions (see the module docstring).

    Args:
        horizon: decisions simulated per candidate (15 s each).
        max_agents: aircraft per scenario whose instruction is optimised (most urgent predicted conflict first).
    """

    def __init__(self, horizon: int = 4, max_agents: int = 3):
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon must be a positive int, got {horizon!r}")
        if isinstance(max_agents, bool) or not isinstance(max_agents, int) or max_agents < 1:
            raise ValueError(f"max_agents must be a positive int, got {max_agents!r}")
        self.horizon, self.K = horizon, max_agents
        self.decisions = 0
        self.sim_decisions = 0

    def __call__(self, core: AirspaceCore) -> np.ndarray:
        B, N, A, K = core.B, core.N, N_ACTIONS, min(self.K, core.N)
        shield = KinematicSafetyShield(core)
        safe = shield.safe_mask()
        base = shield.filter(greedy_direct(core), safe)[0]
        geom = core.pairwise()
        # urgency of aircraft i: max over predicted conflicts of exp(-tCPA / 60 s) (0 when none)
        conf = (geom["dcpa"] < core.S + shield.margin) & (geom["tcpa"] < core.H) & geom["both"]
        urg = np.where(conf, np.exp(-geom["tcpa"] / 60.0), 0.0).max(-1) * core.alive
        agents = np.argsort(-urg, axis=1, kind="stable")[:, :K]  # (B, K)
        active = np.take_along_axis(urg, agents, 1) > 0
        if not active.any():
            self.decisions += 1
            return base
        C = 1 + K * A
        first = np.repeat(base, C, axis=0).reshape(B, C, N)
        for k in range(K):
            for a in range(A):
                c = 1 + k * A + a
                first[np.arange(B), c, agents[:, k]] = a
        sim = replicate(core, C)
        score = np.zeros(B * C)
        acts = first.reshape(B * C, N)
        for h in range(self.horizon):
            if h > 0:
                acts = greedy_kss_actions(sim)
            r = sim.step(acts)[0]
            score += r.sum(-1)
            self.sim_decisions += 1
        score = score.reshape(B, C)
        cand = score[:, 1:].reshape(B, K, A)
        allowed = np.take_along_axis(safe, agents[..., None], 1)  # (B, K, A)
        cand = np.where(allowed, cand, -np.inf)
        best = cand.argmax(-1)
        better = (cand.max(-1) > score[:, :1] + 1e-9) & active
        out = base.copy()
        for k in range(K):
            rows = np.nonzero(better[:, k])[0]
            out[rows, agents[rows, k]] = best[rows, k]
        self.decisions += 1
        return out
