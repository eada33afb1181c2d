"""``icml26.air.envs``: the embedded agent environments and their scenarios (:mod:`icml26.air.worlds.embedded`).

Kept for the path documented before AIR was split into layers (README); it only re-exports, and no AIR
module imports it.
"""

from __future__ import annotations

from .worlds.embedded import (
    AGENT_TYPES,
    EMAIL_FAMILIES,
    FAMILIES,
    HELD_OUT,
    HOME,
    HOUSEHOLD_FAMILIES,
    N_VARIANTS,
    SHELL_FAMILIES,
    EmailEnv,
    Env,
    HouseholdEnv,
    Scenario,
    ShellEnv,
    ToolError,
    scenarios,
)

__all__ = [
    "AGENT_TYPES",
    "EMAIL_FAMILIES",
    "FAMILIES",
    "HELD_OUT",
    "HOME",
    "HOUSEHOLD_FAMILIES",
    "N_VARIANTS",
    "SHELL_FAMILIES",
    "EmailEnv",
    "Env",
    "HouseholdEnv",
    "Scenario",
    "ShellEnv",
    "ToolError",
    "scenarios",
]
