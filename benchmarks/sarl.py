"""SARL: cost per agent-decision of the batched airspace core against TorchRL's ``PettingZooWrapper`` on the
same environment, as ratios in one run.

20 aircraft in the ``streams`` world (R = 40 NM), random instructions, with and without the Kinematic Safety
Shield; the batched core steps 8 scenarios at once, TorchRL's wrapper (``torchrl 0.14.1``, the ``torchrl``
package) steps one ``parallel_env`` through per-agent dicts (``rollout``). Each arm runs ``--rounds`` times,
interleaved; the median CPU time per agent-decision is reported. Writes ``results/sarl/bench.json``; ``icml26
report`` renders it into the README. Run: ``.venv/bin/python benchmarks/sarl.py``.
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--out", default="results", help="results root; the JSON goes to <out>/sarl/bench.json"
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
    write_bench(
        "sarl",
        rows,
        out_dir=args.out,
        conditions=f"{N} aircraft, streams world R = {R} NM, random instructions, {args.steps} decisions, "
        f"median of {args.rounds} rounds, CPU time per agent-decision, one torch thread",
    )


if __name__ == "__main__":
    main()
