"""KSS, a Kinematic Safety Shield (reconstruction): constant-velocity CPA checks per candidate instruction, ranked
by severity, with a right-of-way preference after ICAO Annex 2 3.2.2 / SERA.3210.

For aircraft i and instruction a, the velocity i would fly after a is tested against every other active
aircraft's current velocity over the lookahead H: a violation is dCPA < S + margin; the severity sums
``(S + margin - dCPA) / (tCPA + 10 s)`` over violations. The safe set holds the actions whose severity is within
``eps`` of the best one; among equally safe actions the preference order favours right turns (head-on and
converging traffic turns right). The mask is a preemptive shield in training (unsafe logits set to -inf, the mask
stored for the PPO update) and a post-posed one at inference (an unsafe choice is replaced by the safest action,
ties broken by preference). It is not a guarantee: it assumes the other aircraft keep their velocity.

Example:
    >>> import numpy as np
    >>> from icml26.sarl.env import AirspaceCore
    >>> core = AirspaceCore(n_envs=3, n_aircraft=6, seed=1)
    >>> shield = KinematicSafetyShield(core)
    >>> shield.safe_mask().shape
    (3, 6, 8)
"""

from __future__ import annotations

import numpy as np

from .env import N_ACTIONS, AirspaceCore, cpa

# maintain < right 15 < right 30 < slower < faster < direct < left 15 < left 30 (SERA: prefer right)
PREFERENCE = np.array([0, 6, 1, 7, 2, 3, 4, 5], dtype=float)


class KinematicSafetyShield:
    """See the module docstring. ``mode="severity"`` (safe = within eps of the lowest severity) or ``"count"``
    (safe = the fewest violations)."""

    def __init__(
        self,
        core: AirspaceCore,
        *,
        lookahead_s: float = 180.0,
        margin_nm: float = 1.0,
        mode: str = "severity",
        eps: float = 1e-6,
    ):
        if mode not in ("severity", "count"):
            raise ValueError(f"mode must be 'severity' or 'count', got {mode!r}")
        self.core, self.H, self.margin, self.mode, self.eps = core, lookahead_s, margin_nm, mode, eps

    def severity(self) -> tuple[np.ndarray, np.ndarray]:
        """(B, N, A) severity and violation count of every candidate instruction."""
        c = self.core
        acts = np.broadcast_to(np.arange(N_ACTIONS), (c.B, c.N, N_ACTIONS))
        hdg, spd = c.command_after(acts)  # (B, N, A)
        h = np.radians(hdg)
        v_i = np.stack([spd * np.sin(h), spd * np.cos(h)], -1)  # (B, N, A, 2)
        v_j = c.velocities()  # (B, N, 2)
        p = np.stack([c.x, c.y], -1)
        rel_p = (p[:, None, :, :] - p[:, :, None, :])[:, :, None]  # (B, i, 1, j, 2)
        rel_v = v_j[:, None, None, :, :] - v_i[:, :, :, None, :]  # (B, i, A, j, 2)
        t, d = cpa(np.broadcast_to(rel_p, rel_v.shape), rel_v, self.H)
        both = c.alive[:, :, None] & c.alive[:, None, :] & ~np.eye(c.N, dtype=bool)[None]
        viol = (d < c.S + self.margin) & both[:, :, None, :]
        sev = np.where(viol, (c.S + self.margin - d) / (t + 10.0), 0.0).sum(-1)
        return sev, viol.sum(-1)

    def safe_mask(self) -> np.ndarray:
        """(B, N, A) True where the instruction is in the safe set (all True for empty slots)."""
        sev, count = self.severity()
        score = sev if self.mode == "severity" else count.astype(float)
        best = score.min(-1, keepdims=True)
        mask = score <= best + self.eps
        return mask | ~self.core.alive[..., None]

    def filter(self, actions: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Replace unsafe choices by the safest action (preference breaks ties); returns (actions, overridden)."""
        sev, count = self.severity()
        mask = self.safe_mask() if mask is None else mask
        a = np.asarray(actions, dtype=int)
        ok = np.take_along_axis(mask, a[..., None], -1)[..., 0] | ~self.core.alive
        score = (sev if self.mode == "severity" else count.astype(float)) * 1e3 + PREFERENCE
        best = np.argmin(np.where(mask, score, np.inf), -1)
        return np.where(ok, a, best), ~ok
