"""A batched 2-D airspace for conflict resolution (the dynamics; its PettingZoo ``ParallelEnv`` is ``pz.py``).

``AirspaceCore`` simulates B scenarios x N aircraft slots in numpy. Heading is clockwise from north, x = east
(v_x = v sin hdg, v_y = v cos hdg), a right turn adds heading. Each decision lasts ``dt * substeps`` seconds
(default 3 x 5 s); aircraft turn at rate one (3 deg/s) and change speed at 1 kt/s towards their cleared heading
and speed. Loss of separation (LoS): horizontal distance < 5 NM (2-D; BlueSky's default minima), checked at every
substep; events are rising edges per pair, time is seconds in LoS. An aircraft leaves at its exit fix (capture
radius 2 NM). Instructions (ATC phraseology): 0 maintain (no new clearance), 1/2 turn left/right 15 deg, 3/4 turn
left/right 30 deg (relative to the cleared heading), 5/6 speed -/+ 20 kt (300-480 kt), 7 direct to the exit at
the nominal speed.

Scenarios: ``circle`` (aircraft on a ring heading to the antipode +-25 deg), ``crossing`` (entry and exit on
the ring at least 90 deg apart) and ``streams`` (issue #27: four traffic flows, two merging onto one exit fix and
two crossing the sector, aircraft queued in trail behind their entry fixes at 10-16 NM, 380-460 kt, so followers
catch up); spawns closer than 2 S and scenarios whose first predicted LoS is under 60 s are rejected.
``n_aircraft`` may be a range (mixed traffic): unused slots stay empty. Metrics per episode include the extra path
and the delay (seconds beyond the straight path at the nominal speed, arrived aircraft).

Example:
    >>> core = AirspaceCore(n_envs=2, n_aircraft=5, seed=0)
    >>> x, e, m = core.node_features(), *core.edge_features()
    >>> x.shape, e.shape, m.shape
    ((2, 5, 8), (2, 5, 5, 11), (2, 5, 5))
    >>> _ = core.step(np.zeros((2, 5), dtype=int))
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

N_ACTIONS = 8
SCENARIOS = ("circle", "crossing", "streams")
#: traffic flows of the ``streams`` scenario (two merging, two crossing)
STREAMS = 4
ACTION_NAMES = ("maintain", "left15", "right15", "left30", "right30", "slower", "faster", "direct")
_TURN = np.array([0.0, -15.0, 15.0, -30.0, 30.0, 0.0, 0.0, 0.0])
_SPD = np.array([0.0, 0.0, 0.0, 0.0, 0.0, -20.0, 20.0, 0.0])


def _wrap(deg: np.ndarray) -> np.ndarray:
    """Angle in (-180, 180]."""
    return (np.asarray(deg) + 180.0) % 360.0 - 180.0


def cpa(p: np.ndarray, w: np.ndarray, horizon: float) -> tuple[np.ndarray, np.ndarray]:
    """Time (s) and distance (NM) of closest approach of relative position ``p`` (NM) and velocity ``w`` (kt),
    straight lines, time clipped to [0, horizon]."""
    w_s = w / 3600.0  # NM per second
    ww = (w_s**2).sum(-1)
    t = np.where(ww > 1e-12, -(p * w_s).sum(-1) / np.maximum(ww, 1e-12), 0.0)
    t = np.clip(t, 0.0, horizon)
    d = np.linalg.norm(p + w_s * t[..., None], axis=-1)
    return t, d


class AirspaceCore:
    """Batched airspace: ``n_envs`` scenarios x ``max(n_aircraft)`` slots (see the module docstring)."""

    def __init__(
        self,
        n_envs: int = 64,
        n_aircraft: int | Sequence[int] = 5,
        *,
        radius_nm: float = 30.0,
        dt: float = 5.0,
        substeps: int = 3,
        max_steps: int = 80,
        sep_nm: float = 5.0,
        obs_radius_nm: float = 40.0,
        lookahead_s: float = 180.0,
        capture_nm: float = 2.0,
        scenario: str = "crossing",
        seed: int | None = None,
        auto_reset: bool = True,
    ):
        sizes = [n_aircraft] if isinstance(n_aircraft, int) else list(n_aircraft)
        if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
            raise ValueError(f"n_aircraft must be a positive int or a list of them, got {n_aircraft!r}")
        if scenario not in SCENARIOS:
            raise ValueError(f"scenario must be one of {SCENARIOS}, got {scenario!r}")
        for name, value in (("n_envs", n_envs), ("substeps", substeps), ("max_steps", max_steps)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name, value in (
            ("dt", dt),
            ("sep_nm", sep_nm),
            ("obs_radius_nm", obs_radius_nm),
            ("lookahead_s", lookahead_s),
            ("capture_nm", capture_nm),
            ("radius_nm", radius_nm),
        ):
            if not np.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if radius_nm <= 2 * sep_nm:
            raise ValueError(f"radius_nm must exceed 2 * sep_nm = {2 * sep_nm}, got {radius_nm!r}")
        self.B, self.sizes, self.N = n_envs, sizes, max(sizes)
        self.R, self.dt, self.substeps, self.max_steps = radius_nm, dt, substeps, max_steps
        self.S, self.R_obs, self.H, self.capture = sep_nm, obs_radius_nm, lookahead_s, capture_nm
        self.scenario, self.auto_reset = scenario, auto_reset
        self.rng = np.random.default_rng(seed)
        shape = (self.B, self.N)
        self.x, self.y, self.hdg, self.spd = (np.zeros(shape) for _ in range(4))
        self.cmd_hdg, self.cmd_spd, self.nominal = (np.zeros(shape) for _ in range(3))
        self.exit_x, self.exit_y, self.straight = (np.zeros(shape) for _ in range(3))
        self.airborne_s = np.zeros(shape)  # seconds flown until arrival (or so far)
        self.present = np.zeros(shape, bool)  # the slot holds an aircraft this episode
        self.alive = np.zeros(shape, bool)
        self.arrived = np.zeros(shape, bool)
        self.prev_action = np.zeros(shape, int)
        self.flown = np.zeros(shape)
        self.instructions, self.changes, self.los_time, self.overrides = (np.zeros(shape) for _ in range(4))
        self.los_events = np.zeros(self.B)
        self.pair_los = np.zeros((self.B, self.N, self.N), bool)
        self.t = np.zeros(self.B, int)
        self.finished: list[dict[str, float]] = []
        #: what the scenario now in env b is (``scenario_id``), set when it spawns
        self.scenario_ids: list[str] = [""] * self.B
        #: where set to a list, every scenario spawned from then on appends its id (the training scenarios' ids)
        self.spawn_log: list[str] | None = None
        self.reset(np.ones(self.B, bool))

    # ------------------------------------------------------------------------------------------- scenarios
    def _streams(self, n: int) -> tuple[np.ndarray, ...]:
        """Entry points, exits and speeds of the ``streams`` family: 4 traffic flows from entry fixes on the
        sector boundary at least 40 deg apart; flows 0 and 1 merge onto one exit fix, flows 2 and 3 cross the
        sector to exits 150-210 deg from their entries (so crossing angles vary scenario to scenario). Aircraft
        are assigned to flows in turn and queue in trail behind the entry fix (spacing 10-16 NM, so they start up
        to a few trail lengths outside the boundary); speeds 380-460 kt, so followers catch up."""
        for _ in range(100):
            ent = np.sort(self.rng.uniform(0, 360, STREAMS))
            gaps = np.diff(np.r_[ent, ent[0] + 360.0])
            if gaps.min() >= 40.0:
                break
        ent = self.rng.permutation(ent)
        ext = np.empty(STREAMS)
        ext[:2] = ent[:2].mean() + 180.0 + self.rng.uniform(-20, 20)  # the merge: one exit fix for 0 and 1
        ext[2:] = ent[2:] + 180.0 + self.rng.uniform(-30, 30, STREAMS - 2)
        flow = np.arange(n) % STREAMS
        rank = np.arange(n) // STREAMS
        back = np.zeros(n)
        for f in range(STREAMS):
            k = flow == f
            back[k] = np.cumsum(np.r_[0.0, self.rng.uniform(10, 16, k.sum() - 1)]) if k.any() else 0.0
        back += self.rng.uniform(0, 8, STREAMS)[flow] * (rank == 0)
        a_in, a_out = np.radians(ent[flow]), np.radians(ext[flow])
        ex, ey = self.R * np.sin(a_out), self.R * np.cos(a_out)
        fx, fy = self.R * np.sin(a_in), self.R * np.cos(a_in)  # entry fix
        ux, uy = (ex - fx), (ey - fy)
        norm = np.hypot(ux, uy)
        px, py = fx - back * ux / norm, fy - back * uy / norm  # in trail behind the entry fix
        return px, py, ex, ey, self.rng.uniform(380, 460, n)

    def _spawn(self, b: int) -> None:
        n = int(self.rng.choice(self.sizes))
        for _ in range(200):
            if self.scenario == "streams":
                px, py, ex, ey, spd = self._streams(n)
            else:
                ang_in = self.rng.uniform(0, 360, n)
                if self.scenario == "circle":
                    ang_out = ang_in + 180.0 + self.rng.uniform(-25, 25, n)
                else:
                    ang_out = ang_in + self.rng.uniform(90, 270, n)
                px, py = self.R * np.sin(np.radians(ang_in)), self.R * np.cos(np.radians(ang_in))
                ex, ey = self.R * np.sin(np.radians(ang_out)), self.R * np.cos(np.radians(ang_out))
                spd = self.rng.uniform(380, 460, n)
            hdg = np.degrees(np.arctan2(ex - px, ey - py)) % 360
            d = np.hypot(px[:, None] - px[None], py[:, None] - py[None]) + np.eye(n) * 1e9
            if d.min() < 2 * self.S:
                continue
            v = np.stack([spd * np.sin(np.radians(hdg)), spd * np.cos(np.radians(hdg))], -1)
            p = np.stack([px, py], -1)
            t, dc = cpa(p[None] - p[:, None], v[None] - v[:, None], self.H)
            first = np.where((dc < self.S) & ~np.eye(n, dtype=bool), t, np.inf)
            if first.min() < 60.0:
                continue
            break
        sl = slice(0, n)
        self.present[b], self.alive[b], self.arrived[b] = False, False, False
        self.present[b, sl] = self.alive[b, sl] = True
        self.x[b, sl], self.y[b, sl], self.hdg[b, sl], self.spd[b, sl] = px, py, hdg, spd
        self.cmd_hdg[b, sl], self.cmd_spd[b, sl], self.nominal[b, sl] = hdg, spd, spd
        self.exit_x[b, sl], self.exit_y[b, sl] = ex, ey
        self.straight[b] = 1.0
        self.straight[b, sl] = np.maximum(np.hypot(ex - px, ey - py) - self.capture, 1e-6)
        for arr in (
            self.flown[b],
            self.instructions[b],
            self.changes[b],
            self.los_time[b],
            self.overrides[b],
            self.airborne_s[b],
        ):
            arr[:] = 0.0
        self.prev_action[b] = 0
        self.los_events[b] = 0.0
        self.pair_los[b] = False
        self.t[b] = 0
        self.scenario_ids[b] = self.scenario_id(b)
        if self.spawn_log is not None:
            self.spawn_log.append(self.scenario_ids[b])

    def scenario_id(self, b: int) -> str:
        """What the scenario just spawned in env ``b`` is: the family, the aircraft count and a hash of the sector
        radius and every aircraft's start position, heading, speed and exit fix (rounded to 1e-9). Two scenarios
        have the same id exactly when they are the same traffic problem, whichever generator seed drew them, so
        ids compare evaluation, validation and training scenarios (``SeedRun.unit_ids`` / ``held_out``)."""
        pres = self.present[b]
        parts = [
            np.round(a[b][pres], 9) for a in (self.x, self.y, self.hdg, self.spd, self.exit_x, self.exit_y)
        ]
        h = hashlib.sha1(np.asarray([self.R], float).tobytes())
        for a in parts:
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        return f"{self.scenario}-N{int(pres.sum())}-{h.hexdigest()[:16]}"

    def reset(self, mask: np.ndarray, seeds: Sequence[Any] | None = None) -> None:
        """Start new scenarios in the envs where ``mask`` is True.

        With ``seeds`` (one per selected env, in env order), env b's scenario is drawn from
        ``np.random.default_rng(seed)`` alone: the same scenario whatever ran before, so that evaluation episodes
        pair across policies. Without, scenarios come from the core's own stream.
        """
        envs = np.nonzero(np.asarray(mask, bool))[0]
        if seeds is not None and len(seeds) != len(envs):
            raise ValueError(f"need one seed per reset env: {len(envs)} envs, {len(seeds)} seeds")
        for k, b in enumerate(envs):
            if seeds is None:
                self._spawn(int(b))
                continue
            own, self.rng = self.rng, np.random.default_rng(seeds[k])
            try:
                self._spawn(int(b))
            finally:
                self.rng = own

    # --------------------------------------------------------------------------------------------- geometry
    def velocities(self, hdg: np.ndarray | None = None, spd: np.ndarray | None = None) -> np.ndarray:
        h = np.radians(self.hdg if hdg is None else hdg)
        s = self.spd if spd is None else spd
        return np.stack([s * np.sin(h), s * np.cos(h)], -1)

    def command_after(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cleared heading and speed after ``action`` (per slot, or with a trailing action axis)."""
        a = np.asarray(action)
        extra = a.ndim - self.cmd_hdg.ndim
        ch = self.cmd_hdg.reshape(self.cmd_hdg.shape + (1,) * extra)
        cs = self.cmd_spd.reshape(self.cmd_spd.shape + (1,) * extra)
        nom = self.nominal.reshape(self.nominal.shape + (1,) * extra)
        bearing = (np.degrees(np.arctan2(self.exit_x - self.x, self.exit_y - self.y)) % 360).reshape(ch.shape)
        hdg = np.where(a == 7, bearing, (ch + _TURN[a]) % 360)
        spd = np.where(a == 7, nom, np.clip(cs + _SPD[a], 300, 480))
        return hdg, spd

    def pairwise(self) -> dict[str, np.ndarray]:
        """Relative geometry of every ordered pair (i observes j)."""
        p = np.stack([self.x, self.y], -1)
        v = self.velocities()
        rel_p = p[:, None] - p[:, :, None]  # (B, i, j, 2): j relative to i
        rel_v = v[:, None] - v[:, :, None]
        rng = np.linalg.norm(rel_p, axis=-1)
        t, d = cpa(rel_p, rel_v, self.H)
        both = self.alive[:, :, None] & self.alive[:, None, :] & ~np.eye(self.N, dtype=bool)[None]
        return {"rel_p": rel_p, "rel_v": rel_v, "range": rng, "tcpa": t, "dcpa": d, "both": both}

    # --------------------------------------------------------------------------------------------- features
    def node_features(self) -> np.ndarray:
        """(B, N, 8): cos/sin drift to exit, distance to exit / R, speed error, pending speed change, altitude and
        pending altitude change (0 in 2-D), pending heading change."""
        bearing = np.degrees(np.arctan2(self.exit_x - self.x, self.exit_y - self.y))
        drift = np.radians(_wrap(bearing - self.hdg))
        dist = np.hypot(self.exit_x - self.x, self.exit_y - self.y) / self.R
        f = np.stack(
            [
                np.cos(drift),
                np.sin(drift),
                dist,
                (self.spd - self.nominal) / 100.0,
                (self.cmd_spd - self.spd) / 100.0,
                np.zeros_like(dist),
                np.zeros_like(dist),
                _wrap(self.cmd_hdg - self.hdg) / 180.0,
            ],
            -1,
        )
        return np.where(self.alive[..., None], f, 0.0).astype(np.float32)

    def edge_features(self, geom: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(B, N, N, 11) edge features in i's frame and the (B, N, N) neighbour mask (range < R_obs)."""
        g = geom or self.pairwise()
        h = np.radians(self.hdg)[:, :, None]
        fwd = np.stack([np.sin(h), np.cos(h)], -1)  # (B, i, 1, 2)
        right = np.stack([np.cos(h), -np.sin(h)], -1)
        rp, rv = g["rel_p"], g["rel_v"]
        conflict = (g["dcpa"] < self.S) & (g["tcpa"] < self.H) & (g["tcpa"] > 0)
        e = np.stack(
            [
                (rp * fwd).sum(-1) / self.R_obs,
                (rp * right).sum(-1) / self.R_obs,
                (rv * fwd).sum(-1) / 600.0,
                (rv * right).sum(-1) / 600.0,
                g["range"] / self.R_obs,
                g["tcpa"] / self.H,
                np.minimum(g["dcpa"] / self.S, 4.0),
                np.zeros_like(g["range"]),
                conflict.astype(float),
                np.exp(-g["tcpa"] / 60.0),
                (g["range"] < self.S).astype(float),
            ],
            -1,
        )
        mask = g["both"] & (g["range"] < self.R_obs)
        return np.where(mask[..., None], e, 0.0).astype(np.float32), mask

    def knn_features(self, k: int = 4) -> np.ndarray:
        """(B, N, 8 + 11 k): own features and the edge features of the k nearest neighbours (zero-padded)."""
        x = self.node_features()
        e, mask = self.edge_features()
        rng = np.where(mask, e[..., 4], np.inf)
        order = np.argsort(rng, axis=-1)[..., :k]
        near = np.take_along_axis(e, order[..., None], axis=2)
        ok = np.take_along_axis(mask, order, axis=2)[..., None]
        near = np.where(ok, near, 0.0)
        if near.shape[2] < k:  # fewer slots than k: zero padding
            near = np.concatenate([near, np.zeros((self.B, self.N, k - near.shape[2], near.shape[3]))], 2)
        return np.concatenate([x, near.reshape(self.B, self.N, -1)], -1).astype(np.float32)

    def context(self, geom: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """(B, N, 2): predicted conflicts (/4) and max urgency exp(-tCPA/60) (the SC-MoE router's context)."""
        g = geom or self.pairwise()
        conflict = (g["dcpa"] < self.S) & (g["tcpa"] < self.H) & g["both"]
        urgency = np.where(conflict, np.exp(-g["tcpa"] / 60.0), 0.0).max(-1)
        return np.stack([conflict.sum(-1) / 4.0, urgency], -1).astype(np.float32)

    # ------------------------------------------------------------------------------------------------- step
    def step(
        self, actions: np.ndarray, overridden: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Apply one instruction per slot; returns (reward (B,N), agent done (B,N), env done (B,),
        alive before the step (B,N), info). Finished envs are reset; their metrics are appended to
        ``finished``."""
        a = np.asarray(actions, dtype=int)
        if a.shape != (self.B, self.N) or a.min() < 0 or a.max() >= N_ACTIONS:
            raise ValueError(f"actions must be ints in [0, {N_ACTIONS}) of shape {(self.B, self.N)}")
        alive0 = self.alive.copy()
        ch, cs = self.command_after(a)
        self.cmd_hdg, self.cmd_spd = np.where(alive0, ch, self.cmd_hdg), np.where(alive0, cs, self.cmd_spd)
        issued = alive0 & (a != 0)
        changed = alive0 & (a != self.prev_action)
        self.instructions += issued
        self.changes += changed
        self.prev_action = np.where(alive0, a, self.prev_action)
        if overridden is not None:
            self.overrides += np.asarray(overridden, bool) & alive0
        in_los = np.zeros((self.B, self.N), bool)
        arrived_now = np.zeros((self.B, self.N), bool)
        for _ in range(self.substeps):
            dh = np.clip(_wrap(self.cmd_hdg - self.hdg), -3.0 * self.dt, 3.0 * self.dt)
            self.hdg = np.where(self.alive, (self.hdg + dh) % 360, self.hdg)
            ds = np.clip(self.cmd_spd - self.spd, -self.dt, self.dt)
            self.spd = np.where(self.alive, self.spd + ds, self.spd)
            v = self.velocities()
            step_nm = v * self.dt / 3600.0
            self.x = np.where(self.alive, self.x + step_nm[..., 0], self.x)
            self.y = np.where(self.alive, self.y + step_nm[..., 1], self.y)
            self.flown += np.where(self.alive, np.linalg.norm(step_nm, axis=-1), 0.0)
            self.airborne_s += self.alive * self.dt
            p = np.stack([self.x, self.y], -1)
            d = np.linalg.norm(p[:, None] - p[:, :, None], axis=-1)
            both = self.alive[:, :, None] & self.alive[:, None, :] & ~np.eye(self.N, dtype=bool)[None]
            los = both & (d < self.S)
            self.los_events += (los & ~self.pair_los).sum((1, 2)) / 2.0
            self.pair_los = los
            any_los = los.any(-1)
            self.los_time += any_los * self.dt
            in_los |= any_los
            arr = self.alive & (np.hypot(self.exit_x - self.x, self.exit_y - self.y) < self.capture)
            arrived_now |= arr
            self.arrived |= arr
            self.alive &= ~arr
        geom = self.pairwise()
        predicted = ((geom["dcpa"] < self.S) & (geom["tcpa"] < self.H) & geom["both"]).sum(-1)
        bearing = np.degrees(np.arctan2(self.exit_x - self.x, self.exit_y - self.y))
        drift = np.abs(_wrap(bearing - self.hdg)) / 180.0
        reward = (
            -1.0 * in_los
            - 0.1 * predicted
            - 0.05 * drift * self.alive
            - 0.02 * issued
            - 0.02 * changed
            + 1.0 * arrived_now
        ) * alive0
        self.t += 1
        env_done = (~self.alive.any(-1)) | (self.t >= self.max_steps)
        agent_done = alive0 & (~self.alive | env_done[:, None])
        info = {"in_los": in_los, "arrived": arrived_now}
        if env_done.any():
            for b in np.nonzero(env_done)[0]:
                self.finished.append(self.episode_metrics(int(b)))
            if self.auto_reset:
                self.reset(env_done)
        return reward.astype(np.float32), agent_done, env_done, alive0, info

    def episode_metrics(self, b: int) -> dict[str, float]:
        """The finished (or current) episode's metrics in env ``b``."""
        pres = self.present[b]
        n = max(int(pres.sum()), 1)
        conflict_free = (self.los_time[b] == 0) & pres
        extra = np.where(self.arrived[b] & pres, self.flown[b] / self.straight[b] - 1.0, np.nan)
        # delay: seconds beyond the straight path at the aircraft's initial (nominal) speed, arrived aircraft only
        delay = np.where(
            self.arrived[b] & pres,
            self.airborne_s[b] - 3600.0 * self.straight[b] / np.maximum(self.nominal[b], 1.0),
            np.nan,
        )
        return {
            "n": float(n),
            "success": float(self.los_events[b] == 0 and self.arrived[b][pres].all()),
            "arrived": float(self.arrived[b][pres].mean()),
            "ac_conflict_free": float(conflict_free.sum() / n),
            "los_events": float(self.los_events[b]),
            "los_time": float(self.los_time[b][pres].sum()),
            "extra_path": float(np.nanmean(extra)) if np.isfinite(extra).any() else float("nan"),
            "delay_s": float(np.nanmean(delay)) if np.isfinite(delay).any() else float("nan"),
            "instructions": float(self.instructions[b][pres].mean()),
            "changes": float(self.changes[b][pres].mean()),
            "overrides": float(self.overrides[b][pres].mean()),
        }
