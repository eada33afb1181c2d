"""SARL: structure-aligned MARL for aircraft conflict resolution (reconstruction from the abstract).

A batched 2-D airspace (``AirspaceCore``) and its PettingZoo ``ParallelEnv`` (``parallel_env``), the Kinematic
Safety Shield (``KinematicSafetyShield``), the PERG graph-attention encoder with the SC-MoE head (``SARLPolicy``),
an MLP over the k nearest intruders (``KNNMLPPolicy``), shared-parameter MAPPO (``train``) and evaluation.
Needs the ``rl`` extra for PettingZoo. No paper numbers exist; nothing here is "from the paper".

Layers, each importing only from below: ``env`` (the dynamics) < ``shield`` < ``pz`` (the PettingZoo adapter,
exported lazily); ``env`` < ``policy``; ``shield`` < ``mappo`` < ``experiment`` < ``lab`` (the lookahead planner and
the BlueSky cross-check).
"""

from __future__ import annotations

from typing import Any

from .env import ACTION_NAMES, N_ACTIONS, AirspaceCore, cpa
from .mappo import PPOConfig, evaluate, fly_straight, gae_advantages, greedy_direct, greedy_policy, train
from .policy import KNNMLPPolicy, PERGEncoder, SARLPolicy, SCMoEHead, physics_prior
from .shield import KinematicSafetyShield

__all__ = [
    "ACTION_NAMES",
    "N_ACTIONS",
    "AirspaceCore",
    "KNNMLPPolicy",
    "KinematicSafetyShield",
    "PERGEncoder",
    "PPOConfig",
    "SARLPolicy",
    "SCMoEHead",
    "cpa",
    "evaluate",
    "fly_straight",
    "gae_advantages",
    "greedy_direct",
    "greedy_policy",
    "parallel_env",  # lazy: PettingZoo (the ``rl`` extra) is imported only when it is asked for
    "physics_prior",
    "train",
]


def __getattr__(name: str) -> Any:
    if name == "parallel_env":
        from ..common.optional import requires

        requires("pettingzoo", extra="rl", purpose="the PettingZoo airspace")
        from . import pz

        return getattr(pz, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
