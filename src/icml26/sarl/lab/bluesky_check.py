"""Cross-check of the batched airspace core against BlueSky (issue #27, item 4): the same scenarios and the same
instruction sequences, flown by both simulators, compared on trajectories and losses of separation.

``record`` flies one seeded ``streams`` scenario in ``AirspaceCore`` under a reference controller (``fly_straight``
or ``greedy_kss``: direct-to plus the Kinematic Safety Shield) and keeps, per decision, the clearance in force
(heading and speed, as the core issues them: a turn or speed instruction changes the cleared value, direct-to
clears the bearing to the exit fix at the nominal speed), and our trajectory every substep (5 s). ``fly_bluesky``
replays these clearances open loop in BlueSky headless (``bluesky.init(mode="sim", detached=True)``): every
aircraft is a B744 at FL250 created at our position and heading, the speed is our true airspeed converted to CAS
at FL250, the bank limit gives rate-one turns (3 deg/s) at the aircraft's nominal speed,

    tan(phi) = omega V / g,  omega = 3 deg/s,

and at each decision its autopilot gets ``HDG`` and ``SPD`` with our cleared values; an aircraft is deleted when
ours reaches its exit fix. Positions map between our plane (NM, x east, y north) and latitude / longitude by an
azimuthal equidistant projection about (0, 0) (BlueSky's ``qdrpos`` / ``qdrdist``), where grid north is true
north. BlueSky's own state-based conflict detection (protected zone 5 NM) reports its losses of separation.

``compare`` gives the position error over time and the LoS pairs of both. The tolerances below were written
before the first replay ran. They are not zero because the two models differ on purpose: BlueSky accelerates at
its performance model's limit (about 0.5 m/s^2 for a B744, close to our 1 kt/s), turns at g tan(phi) / V (rate one
only at the nominal speed, slower above it, faster below), holds CAS rather than TAS, integrates at 0.5 s rather
than 5 s, and flies on a sphere. Every one is a transient per instruction, so errors grow with the number of
instructions and stay a fraction of the 5 NM minimum.

Example (needs the ``bluesky`` extra; about 20 s the first time BlueSky loads its navigation data):
    >>> rec = record(n_aircraft=6, seed=0, policy="greedy_kss", radius_nm=30.0)  # doctest: +SKIP
    >>> report = compare(rec, fly_bluesky(rec))  # doctest: +SKIP
    >>> report["pos_err_median_nm"] < POS_MEDIAN_TOL_NM  # doctest: +SKIP
    True

Reference: Hoekstra and Ellerbroek, "BlueSky ATC simulator project: an open data and open source approach",
ICRAT 2016 (``bluesky-simulator``, TU Delft).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..env import AirspaceCore
from ..mappo import fly_straight, greedy_direct
from ..shield import KinematicSafetyShield

#: tolerances, chosen before the first replay (see the module docstring for why they are not zero)
POS_MEDIAN_TOL_NM = 0.5  # median position error over all aircraft and samples: a tenth of the 5 NM minimum
POS_P95_TOL_NM = 1.5  # 95th percentile: transients after a turn or speed change, under a third of the minimum
LOS_BORDER_NM = 1.5  # a pair in LoS in one simulator only must come within 5 + 1.5 NM in the other
MINSEP_TOL_NM = (
    3.0  # closest approach of a close pair (< 10 NM): two aircraft each off by up to the p95 tolerance
)
ACTYPE, FLIGHT_LEVEL_FT, BLUESKY_DT = "B744", 25_000.0, 0.5
RATE_ONE_DEG_S = 3.0
POLICIES = ("fly_straight", "greedy_kss")

_BS: Any = None


@dataclass
class Recording:
    """One scenario flown by ``AirspaceCore``: the clearances per decision and the 5 s trajectory."""

    n: int
    dt: float
    substeps: int
    sep_nm: float
    x0: np.ndarray  # (n,) NM
    y0: np.ndarray
    hdg0: np.ndarray  # deg, clockwise from north
    spd0: np.ndarray  # kt (true airspeed = ground speed, no wind)
    cmd_hdg: np.ndarray  # (T, n) cleared heading in force during decision k
    cmd_spd: np.ndarray  # (T, n) cleared speed
    pos: np.ndarray  # (T * substeps + 1, n, 2) our positions every substep
    alive: np.ndarray  # (T * substeps + 1, n) the aircraft is flying at that sample
    los_pairs: set[tuple[int, int]] = field(default_factory=set)
    wall_s: float = 0.0


@dataclass
class BlueSkyTrace:
    """The same scenario flown by BlueSky: positions at our samples, its LoS pairs and minimum separations."""

    pos: np.ndarray  # (T * substeps + 1, n, 2) NM in our plane, NaN once deleted
    los_pairs: set[tuple[int, int]]
    minsep: np.ndarray  # (n, n) closest approach over every BlueSky step while both fly
    wall_s: float = 0.0  # the replay loop only (after BlueSky's reset and the aircraft's creation)
    cpu_s: float = 0.0


def _controller(policy: str):
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return fly_straight if policy == "fly_straight" else greedy_direct


def record(
    n_aircraft: int = 20,
    seed: int = 0,
    policy: str = "greedy_kss",
    radius_nm: float = 40.0,
    max_steps: int | None = None,
) -> Recording:
    """Fly seeded ``streams`` scenario ``seed`` in ``AirspaceCore`` under ``policy`` and record it.

    Args:
        n_aircraft: aircraft in the scenario (positive int).
        seed: scenario seed (``AirspaceCore.reset(seeds=...)``, as in evaluation).
        policy: ``"fly_straight"`` (no instruction) or ``"greedy_kss"`` (direct-to plus the shield).
        radius_nm: sector radius.
        max_steps: decisions (default: ``experiment.max_steps``).

    Returns:
        A ``Recording`` with clearances per decision and our trajectory every substep.
    """
    from ..experiment import max_steps as default_steps

    act = _controller(policy)
    if isinstance(n_aircraft, bool) or not isinstance(n_aircraft, (int, np.integer)) or n_aircraft < 1:
        raise ValueError(f"n_aircraft must be a positive int, got {n_aircraft!r}")
    steps = default_steps(int(n_aircraft), radius_nm) if max_steps is None else max_steps
    kw = dict(n_envs=1, n_aircraft=int(n_aircraft), radius_nm=radius_nm, scenario="streams", auto_reset=False)
    core = AirspaceCore(max_steps=steps, **kw)
    core.reset(np.ones(1, bool), seeds=[seed])
    n = int(core.present[0].sum())
    x0, y0, hdg0, spd0 = (a[0, :n].copy() for a in (core.x, core.y, core.hdg, core.spd))
    shield = KinematicSafetyShield(core) if policy == "greedy_kss" else None
    cmd_h, cmd_s = [], []
    t0 = time.perf_counter()
    while True:
        a = act(core)
        over = None
        if shield is not None:
            a, over = shield.filter(a)
        _, _, done, _, _ = core.step(a, over)
        cmd_h.append(core.cmd_hdg[0, :n].copy())
        cmd_s.append(core.cmd_spd[0, :n].copy())
        if done[0]:
            break
    wall = time.perf_counter() - t0
    # the same clearances replayed one substep at a time: our trajectory every dt (maintain keeps the clearance)
    fine = AirspaceCore(max_steps=steps * core.substeps, dt=core.dt, substeps=1, **kw)
    fine.reset(np.ones(1, bool), seeds=[seed])
    pos, alive, los = [np.stack([fine.x[0, :n], fine.y[0, :n]], -1)], [fine.alive[0, :n].copy()], set()
    zeros = np.zeros((1, fine.N), int)
    for k in range(len(cmd_h)):
        for _ in range(core.substeps):
            fine.cmd_hdg[0, :n], fine.cmd_spd[0, :n] = cmd_h[k], cmd_s[k]
            fine.step(zeros)
            pos.append(np.stack([fine.x[0, :n], fine.y[0, :n]], -1))
            alive.append(fine.alive[0, :n].copy())
            i, j = np.nonzero(np.triu(fine.pair_los[0, :n, :n], 1))
            los |= set(zip(i.tolist(), j.tolist(), strict=True))
    return Recording(
        n=n,
        dt=core.dt,
        substeps=core.substeps,
        sep_nm=core.S,
        x0=x0,
        y0=y0,
        hdg0=hdg0,
        spd0=spd0,
        cmd_hdg=np.array(cmd_h),
        cmd_spd=np.array(cmd_s),
        pos=np.array(pos),
        alive=np.array(alive),
        los_pairs=los,
        wall_s=wall,
    )


def bluesky() -> Any:
    """BlueSky initialised headless (once per process); the error names the ``bluesky`` extra when missing."""
    global _BS
    if _BS is None:
        from ...common.optional import requires

        requires("bluesky", extra="bluesky", purpose="the BlueSky cross-check of the airspace core")
        import bluesky as bs

        bs.init(mode="sim", detached=True)
        _BS = bs
    return _BS


def fly_bluesky(rec: Recording, dt: float = BLUESKY_DT, min_separation: bool = True) -> BlueSkyTrace:
    """Replay ``rec``'s clearances open loop in BlueSky (see the module docstring).

    Args:
        rec: a ``record``-ed scenario.
        dt: BlueSky's integration step (s), a divisor of the core's substep.
        min_separation: track every pair's closest approach at every BlueSky step (off for timing: it is this
            module's instrumentation, not BlueSky's work; ``minsep`` is then all inf).

    Returns:
        A ``BlueSkyTrace``: positions at our 5 s samples, BlueSky's LoS pairs, closest approaches, timings.
    """
    if not np.isfinite(dt) or dt <= 0 or abs(round(rec.dt / dt) * dt - rec.dt) > 1e-9:
        raise ValueError(f"dt must be a positive divisor of the core's substep {rec.dt}, got {dt!r}")
    bs = bluesky()
    from bluesky.core import simtime
    from bluesky.tools import aero, geo

    bs.sim.reset()
    simtime.setdt(dt)
    alt = FLIGHT_LEVEL_FT * aero.ft
    ids = [f"AC{i:03d}" for i in range(rec.n)]
    r, qdr = np.hypot(rec.x0, rec.y0), np.degrees(np.arctan2(rec.x0, rec.y0))
    lat, lon = geo.qdrpos(np.zeros(rec.n), np.zeros(rec.n), qdr, r)
    for i in range(rec.n):
        bs.traf.cre(ids[i], ACTYPE, float(lat[i]), float(lon[i]), float(rec.hdg0[i]), alt,
                    float(aero.vtas2cas(rec.spd0[i] * aero.kts, alt)))  # fmt: skip
    # bank for rate one at the nominal speed: tan(phi) = omega V / g
    omega = np.radians(RATE_ONE_DEG_S)
    bs.traf.ap.bankdef[:] = np.arctan(omega * rec.spd0 * aero.kts / aero.g0)
    bs.stack.stack("CDMETHOD STATEBASED")

    def plane() -> tuple[np.ndarray, np.ndarray]:
        q, d = geo.qdrdist(np.zeros(bs.traf.ntraf), np.zeros(bs.traf.ntraf), bs.traf.lat, bs.traf.lon)
        q = np.radians(q)
        idx = np.array([int(a[2:]) for a in bs.traf.id], int)
        return idx, np.stack([d * np.sin(q), d * np.cos(q)], -1)

    pos = np.full(rec.pos.shape, np.nan)
    pos[0] = rec.pos[0]
    minsep = np.full((rec.n, rec.n), np.inf)
    per_sub = round(rec.dt / dt)
    t0, c0 = time.perf_counter(), time.process_time()
    s = 0
    for k in range(len(rec.cmd_hdg)):
        idx = np.array([int(a[2:]) for a in bs.traf.id], int)
        if idx.size:
            bs.traf.ap.selhdgcmd(np.arange(idx.size), rec.cmd_hdg[k, idx])
            cas = aero.vtas2cas(rec.cmd_spd[k, idx] * aero.kts, alt)
            bs.traf.ap.selspdcmd(np.arange(idx.size), cas)
        for _ in range(rec.substeps):
            for _ in range(per_sub):
                bs.sim.step()
                if not min_separation:
                    continue
                idx, p = plane()
                if idx.size > 1:
                    d = np.linalg.norm(p[:, None] - p[None], axis=-1)
                    minsep[np.ix_(idx, idx)] = np.minimum(minsep[np.ix_(idx, idx)], d)
            s += 1
            idx, p = plane()
            pos[s, idx] = p
            gone = [j for j, i in enumerate(idx) if not rec.alive[s, i]]
            if gone:
                bs.traf.delete(np.array(gone))
        if bs.traf.ntraf == 0:
            break
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    los = set()
    for pair in bs.traf.cd.lospairs_all:
        i, j = sorted(int(a[2:]) for a in pair)
        los.add((i, j))
    np.fill_diagonal(minsep, np.inf)
    return BlueSkyTrace(pos=pos, los_pairs=los, minsep=minsep, wall_s=wall, cpu_s=cpu)


def _our_minsep(rec: Recording) -> np.ndarray:
    d = np.linalg.norm(rec.pos[:, :, None] - rec.pos[:, None], axis=-1)
    both = rec.alive[:, :, None] & rec.alive[:, None, :]
    m = np.where(both, d, np.inf).min(0)
    np.fill_diagonal(m, np.inf)
    return m


def compare(rec: Recording, trace: BlueSkyTrace) -> dict[str, Any]:
    """Position error over time and LoS agreement of one scenario, checked against the module's tolerances.

    Returns a dict: ``err_nm`` (samples x aircraft, NaN where ours has left), its median / 95th percentile / max,
    ``err_by_time`` (median per sample), the LoS pairs of both, ``los_disagree`` (pairs in one only, with the
    other's closest approach), ``minsep_worst_nm`` (largest closest-approach difference over close pairs), and
    ``ok`` with the failed checks in ``failures``.
    """
    ok_mask = rec.alive[1:] | (rec.alive[:-1])  # samples while ours flies (or on its arrival sample)
    err = np.linalg.norm(trace.pos - rec.pos, axis=-1)[1:]
    err = np.where(ok_mask & np.isfinite(err), err, np.nan)
    flat = err[np.isfinite(err)]
    ours_min, bs_min = _our_minsep(rec), trace.minsep
    disagree = []
    for i, j in sorted(rec.los_pairs ^ trace.los_pairs):
        in_ours = (i, j) in rec.los_pairs
        other = bs_min[i, j] if in_ours else ours_min[i, j]
        disagree.append(
            {"pair": (i, j), "in": "ours" if in_ours else "bluesky", "other_minsep_nm": float(other)}
        )
    close = (np.minimum(ours_min, bs_min) < 10.0) & np.isfinite(ours_min) & np.isfinite(bs_min)
    worst = float(np.abs(ours_min[close] - bs_min[close]).max()) if close.any() else 0.0
    out = {
        "n": rec.n,
        "decisions": len(rec.cmd_hdg),
        "instructions_changed": int(
            (np.diff(rec.cmd_hdg, axis=0) != 0).sum() + (np.diff(rec.cmd_spd, axis=0) != 0).sum()
        ),
        "err_nm": err,
        "err_by_time": np.array([np.median(row[np.isfinite(row)]) for row in err if np.isfinite(row).any()]),
        "pos_err_median_nm": float(np.median(flat)) if flat.size else 0.0,
        "pos_err_p95_nm": float(np.percentile(flat, 95)) if flat.size else 0.0,
        "pos_err_max_nm": float(flat.max()) if flat.size else 0.0,
        "los_ours": sorted(rec.los_pairs),
        "los_bluesky": sorted(trace.los_pairs),
        "los_disagree": disagree,
        "minsep_worst_nm": worst,
        "core_wall_s": rec.wall_s,
        "bluesky_wall_s": trace.wall_s,
    }
    failures = []
    if out["pos_err_median_nm"] > POS_MEDIAN_TOL_NM:
        failures.append(f"median position error {out['pos_err_median_nm']:.3f} NM > {POS_MEDIAN_TOL_NM}")
    if out["pos_err_p95_nm"] > POS_P95_TOL_NM:
        failures.append(f"95th percentile position error {out['pos_err_p95_nm']:.3f} NM > {POS_P95_TOL_NM}")
    for d in disagree:
        if d["other_minsep_nm"] > rec.sep_nm + LOS_BORDER_NM:
            failures.append(
                f"LoS of pair {d['pair']} only in {d['in']}; other's closest {d['other_minsep_nm']:.2f} NM"
            )
    if worst > MINSEP_TOL_NM:
        failures.append(f"closest approach differs by {worst:.2f} NM > {MINSEP_TOL_NM}")
    out["failures"], out["ok"] = failures, not failures
    return out


def cross_check(
    seeds: tuple[int, ...] = (0, 1, 2),
    policies: tuple[str, ...] = POLICIES,
    n_aircraft: int = 20,
    radius_nm: float = 40.0,
) -> list[dict[str, Any]]:
    """``compare`` for every (policy, seed): the scenarios of the slow test and the README section."""
    rows = []
    for policy in policies:
        for seed in seeds:
            rec = record(n_aircraft=n_aircraft, seed=seed, policy=policy, radius_nm=radius_nm)
            row = compare(rec, fly_bluesky(rec))
            row.update(policy=policy, seed=seed)
            rows.append(row)
    return rows


if __name__ == "__main__":  # pragma: no cover - manual summary
    for r in cross_check():
        print(
            f"{r['policy']:>12} seed {r['seed']}: n {r['n']} decisions {r['decisions']} err median "
            f"{r['pos_err_median_nm']:.3f} p95 {r['pos_err_p95_nm']:.3f} max {r['pos_err_max_nm']:.3f} NM; "
            f"LoS ours {len(r['los_ours'])} bluesky {len(r['los_bluesky'])} disagree {r['los_disagree']}; "
            f"minsep worst {r['minsep_worst_nm']:.2f}; core {r['core_wall_s']:.2f} s bluesky {r['bluesky_wall_s']:.2f} s;"
            f" ok {r['ok']} {r['failures']}"
        )
