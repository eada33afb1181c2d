"""SARL: structure-aligned MARL for aircraft conflict resolution (reconstruction from the abstract).

A batched 2-D airspace (``AirspaceCore``) and its PettingZoo ``ParallelEnv`` (``parallel_env``), the Kinematic
Safety Shield (``KinematicSafetyShield``), the PERG graph-attention encoder with the SC-MoE head (``SARLPolicy``),
an MLP over the k nearest intruders (``KNNMLPPolicy``), shared-parameter MAPPO (``train``) and evaluation.
Needs the ``rl`` extra for PettingZoo. No paper numbers exist; nothing here is "from the paper".
"""

from .env import ACTION_NAMES, N_ACTIONS, AirspaceCore, cpa, parallel_env
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
    "parallel_env",
    "physics_prior",
    "train",
]
