"""The airspace as a PettingZoo ``ParallelEnv`` (one agent per aircraft, variable count, action masks).

A thin adapter over the dynamics (``env.AirspaceCore``) and the shield (``shield.KinematicSafetyShield``); neither
imports it. Needs the ``rl`` extra; the package exports ``parallel_env`` lazily.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from .env import N_ACTIONS, AirspaceCore
from .shield import KinematicSafetyShield


class AirspaceParallelEnv(ParallelEnv):
    """See :func:`parallel_env`. Agents are ``aircraft_<slot>``; an aircraft that reaches its exit
    is terminated and leaves ``agents``; the episode is truncated at ``max_steps``. A missing action means
    "maintain"."""

    metadata: ClassVar[dict[str, Any]] = {"name": "icml26_airspace_v0", "render_modes": []}

    def __init__(
        self,
        n_aircraft: int = 5,
        max_aircraft: int | None = None,
        shield: bool = False,
        seed: int | None = None,
        render_mode: str | None = None,
        **kwargs: Any,
    ):
        if render_mode is not None:
            raise ValueError("render_mode: rendering is not supported")
        counts = [n_aircraft] if isinstance(n_aircraft, (int, np.integer)) else n_aircraft
        if (
            isinstance(n_aircraft, bool)
            or not isinstance(counts, (list, tuple, range))
            or not counts
            or not all(
                isinstance(c, (int, np.integer)) and not isinstance(c, bool) and c >= 1 for c in counts
            )
        ):
            raise ValueError(
                f"n_aircraft must be a positive int (or a list of them for mixed traffic), got {n_aircraft!r}"
            )
        largest = int(max(counts))
        if max_aircraft is not None and (
            isinstance(max_aircraft, bool)
            or not isinstance(max_aircraft, (int, np.integer))
            or max_aircraft < largest
        ):
            raise ValueError(f"max_aircraft must be an int >= n_aircraft ({largest}), got {max_aircraft!r}")
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0
        ):
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        if not isinstance(shield, bool):
            raise TypeError(f"shield must be True or False, got {shield!r}")
        # the core's own checks name a bad airspace argument (radius_nm, max_steps, scenario, ...) now, not at reset
        AirspaceCore(n_envs=1, n_aircraft=n_aircraft, seed=0, auto_reset=False, **kwargs)
        self.max_aircraft = int(max_aircraft) if max_aircraft is not None else largest
        self._kwargs = {"n_aircraft": n_aircraft, **kwargs}
        self.shield_on = shield
        self._seed = seed
        self.possible_agents = [f"aircraft_{i}" for i in range(self.max_aircraft)]
        self.render_mode = None
        k = self.max_aircraft - 1
        self._obs_space = spaces.Dict(
            {
                "own": spaces.Box(-np.inf, np.inf, (8,), np.float32),
                "nbr": spaces.Box(-np.inf, np.inf, (k, 11), np.float32),
                "nbr_mask": spaces.Box(0, 1, (k,), np.int8),
                "action_mask": spaces.Box(0, 1, (N_ACTIONS,), np.int8),
            }
        )
        self._act_space = spaces.Discrete(N_ACTIONS)
        self.core: AirspaceCore | None = None
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def _observations(self) -> dict[str, dict[str, np.ndarray]]:
        core = self.core
        x = core.node_features()[0]
        e, mask = core.edge_features()
        e, mask = e[0], mask[0]
        amask = (
            KinematicSafetyShield(core).safe_mask()[0]
            if self.shield_on
            else np.ones((core.N, N_ACTIONS), bool)
        )
        k = self.max_aircraft - 1
        out = {}
        for a in self.agents:
            i = int(a.rsplit("_", 1)[1])
            others = [j for j in range(core.N) if j != i]
            nbr = np.zeros((k, 11), np.float32)
            nm = np.zeros(k, np.int8)
            for slot, j in enumerate(others[:k]):
                nbr[slot] = e[i, j]
                nm[slot] = mask[i, j]
            out[a] = {"own": x[i], "nbr": nbr, "nbr_mask": nm, "action_mask": amask[i].astype(np.int8)}
        return out

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self._seed = seed
        n = self._kwargs["n_aircraft"]
        kwargs = {k: v for k, v in self._kwargs.items() if k != "n_aircraft"}
        self.core = AirspaceCore(n_envs=1, n_aircraft=n, seed=self._seed, auto_reset=False, **kwargs)
        self.agents = [f"aircraft_{i}" for i in range(self.core.N) if self.core.alive[0, i]]
        self._seed = None if self._seed is None else self._seed + 1
        return self._observations(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        core = self.core
        if core is None:
            raise RuntimeError("call reset() before step()")
        a = np.zeros((1, core.N), dtype=int)
        for agent, act in actions.items():
            if agent not in self.agents:
                raise ValueError(f"{agent} is not an active agent")
            if not self._act_space.contains(int(act)):
                raise ValueError(f"invalid action {act!r} for {agent}")
            a[0, int(agent.rsplit("_", 1)[1])] = int(act)
        overridden = None
        if self.shield_on:
            a, overridden = KinematicSafetyShield(core).filter(a)
        r, _, env_done, _, info = core.step(a, overridden)
        acting = list(self.agents)
        rewards = {ag: float(r[0, int(ag.rsplit("_", 1)[1])]) for ag in acting}
        terminations = {ag: bool(core.arrived[0, int(ag.rsplit("_", 1)[1])]) for ag in acting}
        truncations = {ag: bool(env_done[0]) and not terminations[ag] for ag in acting}
        infos = {ag: {"in_los": bool(info["in_los"][0, int(ag.rsplit("_", 1)[1])])} for ag in acting}
        self.agents = [ag for ag in acting if not (terminations[ag] or truncations[ag])]
        obs_all = self._observations_for(acting)
        return obs_all, rewards, terminations, truncations, infos

    def _observations_for(self, agents: list[str]) -> dict[str, dict[str, np.ndarray]]:
        keep = self.agents
        self.agents = agents
        try:
            return self._observations()
        finally:
            self.agents = keep

    def close(self) -> None:
        self.core = None


def parallel_env(
    n_aircraft: int = 5,
    max_aircraft: int | None = None,
    shield: bool = False,
    seed: int | None = None,
    **kwargs: Any,
) -> AirspaceParallelEnv:
    """The airspace as a PettingZoo ``ParallelEnv`` (one agent per aircraft; finished aircraft leave ``agents``).

    Observations are dicts ``{"own": (8,), "nbr": (K, 11), "nbr_mask": (K,), "action_mask": (8,)}`` with the K
    nearest neighbours (K = max_aircraft - 1); with ``shield`` the action mask is the Kinematic Safety Shield's safe
    set, otherwise all ones.
    """
    return AirspaceParallelEnv(
        n_aircraft=n_aircraft, max_aircraft=max_aircraft, shield=shield, seed=seed, **kwargs
    )
