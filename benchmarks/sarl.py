"""SARL: cost per agent-decision of the batched airspace core against TorchRL's ``PettingZooWrapper`` on the
same environment, as ratios in one run.

20 aircraft in the ``streams`` world (R = 40 NM), random instructions, with and without the Kinematic Safety
Shield; the batched core steps 8 scenarios at once, TorchRL's wrapper (``torchrl 0.14.1``, the ``torchrl``
package) steps one ``parallel_env`` through per-agent dicts (``rollout``). Each arm runs ``--rounds`` times,
interleaved; the median CPU time per agent-decision is reported.

With the ``bluesky`` extra installed (issue #27), two more rows: the same ``--bluesky-scenarios`` recorded
``greedy_kss`` scenarios (20 aircraft, seeds 0, 1, ...) replayed open loop in BlueSky headless
(``sarl.lab.bluesky_check.fly_bluesky``, step 0.5 s and BlueSky's default 0.05 s, state-based conflict detection) against
the batched core replaying the same clearances for all of them at once; CPU time per aircraft-decision (15 s of
flight). Writes ``results/sarl/bench.json``; ``icml26 report`` renders it into the README. Run:
``.venv/bin/python benchmarks/sarl.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from icml26.common.bench import bench_row, write_bench
from icml26.sarl import AirspaceCore, KinematicSafetyShield, parallel_env
from icml26.sarl.experiment import max_steps

N, R, B = 20, 40.0, 8


def core_arm(shield: bool, steps: int) -> float:
    """CPU seconds per agent-decision of the batched core (B scenarios x N aircraft)."""
    core = AirspaceCore(
        n_envs=B, n_aircraft=N, radius_nm=R, max_steps=max_steps(N, R), scenario="streams", seed=0
    )
    ks = KinematicSafetyShield(core)
    rng = np.random.default_rng(0)
    t0, decisions = time.process_time(), 0
    for _ in range(steps):
        a = rng.integers(0, 8, (B, N))
        if shield:
            a, _ = ks.filter(a)
        decisions += int(core.alive.sum())
        core.step(a)
    return (time.process_time() - t0) / max(decisions, 1)


def torchrl_arm(shield: bool, steps: int) -> float:
    """CPU seconds per agent-decision of TorchRL's PettingZooWrapper around ``parallel_env``."""
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper

    env = PettingZooWrapper(
        parallel_env(
            n_aircraft=N, shield=shield, seed=0, scenario="streams", radius_nm=R, max_steps=max_steps(N, R)
        ),
        use_mask=True,
        categorical_actions=True,
        return_state=False,
    )
    t0 = time.process_time()
    td = env.rollout(steps, break_when_any_done=False)
    elapsed = time.process_time() - t0
    group = next(k for k in td.keys() if k not in ("done", "terminated", "truncated", "next"))
    decisions = int(td[group]["mask"].sum()) if "mask" in td[group].keys() else steps * N
    return elapsed / max(decisions, 1)


def make_wrapped_env():
    """TorchRL's PettingZooWrapper around the 20-aircraft shielded streams env (module level: picklable)."""
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper

    return PettingZooWrapper(
        parallel_env(
            n_aircraft=N, shield=True, seed=0, scenario="streams", radius_nm=R, max_steps=max_steps(N, R)
        ),
        use_mask=True,
        categorical_actions=True,
        return_state=False,
    )


def collector_rows(frames: int) -> list[dict]:
    """Wall time per agent-decision of TorchRL's collectors over ``PettingZooWrapper(parallel_env(shield=True))``
    (``Collector`` in one process, and ``MultiSyncCollector`` with 2 worker processes), against the batched core with the shield
    in one process (issue #27 item 2: multi-process collectors for full mode). Random instructions; the first batch
    (worker start-up) is excluded."""
    from torchrl.collectors import Collector, MultiSyncCollector

    make = make_wrapped_env

    def run(col) -> float:
        t1, decisions = None, 0
        for td in col:
            if t1 is None:
                t1 = time.perf_counter()
                continue
            group = next(
                k for k in td.keys() if k not in ("done", "terminated", "truncated", "next", "collector")
            )
            decisions += int(td[group]["mask"].sum()) if "mask" in td[group].keys() else td.numel() * N
        col.shutdown()
        return (time.perf_counter() - t1) / max(decisions, 1) * 1e6

    per_batch = max(frames // 5, 10)
    single = run(Collector(make, policy=None, frames_per_batch=per_batch, total_frames=frames))
    multi = run(
        MultiSyncCollector([make, make], policy=None, frames_per_batch=per_batch, total_frames=frames)
    )
    core = AirspaceCore(
        n_envs=B, n_aircraft=N, radius_nm=R, max_steps=max_steps(N, R), scenario="streams", seed=0
    )
    ks, rng = KinematicSafetyShield(core), np.random.default_rng(0)
    t0, decisions = time.perf_counter(), 0
    for _ in range(40):
        a, _ = ks.filter(rng.integers(0, 8, (B, N)))
        decisions += int(core.alive.sum())
        core.step(a)
    core_wall = (time.perf_counter() - t0) / max(decisions, 1) * 1e6
    print(
        f"collectors (wall per agent-decision): sync {single:.1f} us, 2 workers {multi:.1f} us, core {core_wall:.1f} us"
    )
    return [
        bench_row(
            f"icml26 AirspaceCore (B = {B}), with shield, one process, wall",
            f"TorchRL {name} over PettingZooWrapper, with shield, wall",
            round(core_wall, 3),
            round(value, 3),
            unit="us",
        )
        for name, value in (("Collector", single), ("MultiSyncCollector (2 worker processes)", multi))
    ]


def planner_row(decisions: int) -> dict:
    """CPU time per agent-decision of the ceiling candidate (``LookaheadPlanner``, then the shield) against
    ``greedy_kss`` on the same 20-aircraft streams scenarios."""
    from icml26.sarl.lab.planner import LookaheadPlanner, greedy_kss_actions

    out = {}
    for name, act in (("greedy_kss", greedy_kss_actions), ("planner", LookaheadPlanner())):
        core = AirspaceCore(
            n_envs=B, n_aircraft=N, radius_nm=R, max_steps=max_steps(N, R), scenario="streams", seed=0
        )
        ks = KinematicSafetyShield(core)
        t0, n = time.process_time(), 0
        for _ in range(decisions):
            a, _ = ks.filter(act(core))
            n += int(core.alive.sum())
            core.step(a)
        out[name] = (time.process_time() - t0) / max(n, 1) * 1e6
    print(f"planner {out['planner']:.1f} us, greedy_kss {out['greedy_kss']:.1f} us per agent-decision")
    return bench_row(
        f"ceiling candidate (not an arm): LookaheadPlanner (horizon 4, 3 aircraft) + shield, B = {B}",
        f"greedy_kss (direct-to + shield), B = {B}",
        round(out["planner"], 3),
        round(out["greedy_kss"], 3),
        unit="us",
    )


def core_replay_arm(recs: list) -> float:
    """CPU seconds per aircraft-decision of the batched core replaying the recorded clearances of ``recs``."""
    core = AirspaceCore(
        n_envs=len(recs), n_aircraft=N, radius_nm=R, max_steps=10_000, scenario="streams", auto_reset=False
    )
    core.reset(np.ones(len(recs), bool), seeds=list(range(len(recs))))
    zeros = np.zeros((len(recs), N), int)
    steps = max(len(r.cmd_hdg) for r in recs)
    t0, decisions = time.process_time(), 0
    for k in range(steps):
        for b, r in enumerate(recs):
            kk = min(k, len(r.cmd_hdg) - 1)
            core.cmd_hdg[b], core.cmd_spd[b] = r.cmd_hdg[kk], r.cmd_spd[kk]
        decisions += int(core.alive.sum())
        core.step(zeros)
    return (time.process_time() - t0) / max(decisions, 1)


def bluesky_arm(recs: list, dt: float) -> float:
    """CPU seconds per aircraft-decision of BlueSky replaying the same clearances (one scenario at a time)."""
    from icml26.sarl.lab.bluesky_check import fly_bluesky

    elapsed, decisions = 0.0, 0
    for r in recs:
        # the replay loop only: BlueSky's reset and the aircraft's creation are excluded
        elapsed += fly_bluesky(r, dt=dt, min_separation=False).cpu_s
        decisions += int(r.alive[0 : -1 : r.substeps].sum())
    return elapsed / max(decisions, 1)


def bluesky_rows(n_scenarios: int, rounds: int) -> list[dict]:
    """Rows of the batched core against BlueSky on the same recorded scenarios (needs the bluesky extra)."""
    from icml26.common.optional import has

    if not has("bluesky"):
        print("bluesky is not installed (pip install 'icml26[bluesky]'): no BlueSky rows")
        return []
    from icml26.sarl.lab.bluesky_check import bluesky, record

    bluesky()  # load BlueSky (navigation data) outside the timed region
    recs = [record(n_aircraft=N, seed=s, policy="greedy_kss", radius_nm=R) for s in range(n_scenarios)]
    rows = []
    core = statistics.median(core_replay_arm(recs) for _ in range(rounds)) * 1e6
    for dt, label in ((0.5, "step 0.5 s"), (0.05, "default step 0.05 s")):
        bsk = statistics.median(bluesky_arm(recs, dt) for _ in range(1 if dt < 0.5 else rounds)) * 1e6
        print(f"same clearances, {label}: core {core:.1f} us, BlueSky {bsk:.1f} us per aircraft-decision")
        rows.append(
            bench_row(
                f"icml26 AirspaceCore (B = {n_scenarios}), replaying greedy_kss clearances",
                f"BlueSky 1.1.1 headless, {label}, state-based CD, same clearances",
                round(core, 3),
                round(bsk, 3),
                unit="us",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--out", default="results", help="results root; the JSON goes to <out>/sarl/bench.json"
    )
    parser.add_argument("--bluesky-scenarios", type=int, default=2, help="0: no BlueSky rows")
    parser.add_argument(
        "--collector-frames", type=int, default=500, help="frames per TorchRL collector run (0: no rows)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    times: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.rounds):
        for shield in (False, True):
            times.setdefault(("core", shield), []).append(core_arm(shield, args.steps))
            times.setdefault(("torchrl", shield), []).append(torchrl_arm(shield, args.steps))
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    rows = []
    for shield in (False, True):
        label = "with shield" if shield else "no shield"
        print(
            f"{label}: core {med[('core', shield)]:.1f} us, TorchRL wrapper {med[('torchrl', shield)]:.1f} us "
            "per agent-decision"
        )
        rows.append(
            bench_row(
                f"icml26 AirspaceCore (B = {B}), {label}",
                f"TorchRL PettingZooWrapper, {label}",
                round(med[("core", shield)], 3),
                round(med[("torchrl", shield)], 3),
                unit="us",
            )
        )
    rows.append(planner_row(args.steps))
    if args.collector_frames > 0:
        rows += collector_rows(args.collector_frames)
    if args.bluesky_scenarios > 0:
        rows += bluesky_rows(args.bluesky_scenarios, args.rounds)
    write_bench(
        "sarl",
        rows,
        out_dir=args.out,
        conditions=f"{N} aircraft, streams world R = {R} NM, random instructions, {args.steps} decisions, "
        f"median of {args.rounds} rounds, CPU time per agent-decision, one torch thread; BlueSky rows: "
        f"{args.bluesky_scenarios} recorded greedy_kss scenarios, CPU time per aircraft-decision (15 s of flight), "
        f"BlueSky at 0.05 s timed once; ceiling-candidate row: CPU time per agent-decision over {args.steps} decisions; "
        f"collector rows: WALL time per agent-decision over {args.collector_frames} frames after the first batch, "
        "2 CPU cores shared by every process",
    )


if __name__ == "__main__":
    main()
