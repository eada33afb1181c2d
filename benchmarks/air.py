"""AIR: responder overhead per agent step (no LLM calls) against the same scripted loop without AIR, one run.

Every scenario of the three embedded agent types (240 episodes) runs with the scripted agent, once without a
responder and once with the full AIR rules (detection, containment, direct recovery, template eradication);
``--rounds`` interleaved repeats, medians. Per-step time = episode wall time / agent steps. One thread.
Writes ``results/air/bench.json`` (the README's benchmark table is generated from it by ``icml26 report``).
Run: ``.venv/bin/python benchmarks/air.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from icml26.air import builtin_rules
from icml26.air.envs import AGENT_TYPES, scenarios
from icml26.air.experiment import run_episode
from icml26.air.responder import DictState, IncidentResponder
from icml26.air.synth import RuleValidator, TemplateSynthesizer
from icml26.common.bench import bench_row, write_bench
from icml26.common.repro import set_threads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="results", help="results root (bench.json goes to OUT/air/)")
    args = parser.parse_args()
    set_threads(1)
    per_step: dict[str, list[float]] = {"without AIR": [], "with AIR": []}
    hook_ms: list[float] = []
    n_episodes = sum(len(scenarios(agent)) for agent in AGENT_TYPES)
    for _ in range(args.rounds):
        for arm in per_step:
            total, steps = 0.0, 0
            for agent in AGENT_TYPES:
                air = None
                if arm == "with AIR":
                    air = IncidentResponder(builtin_rules(agent), DictState(dict), synthesizer=TemplateSynthesizer(),
                                            validator=RuleValidator([]))
                rng = np.random.default_rng(0)
                for s in scenarios(agent):
                    t0 = time.perf_counter()
                    run_episode(s, air, rng, 0.0)
                    total += time.perf_counter() - t0
                    steps += len(s.steps)
                if air is not None:
                    hook_ms.append(air.overhead_ms())
            per_step[arm].append(1000 * total / steps)
    base, air_ms = statistics.median(per_step["without AIR"]), statistics.median(per_step["with AIR"])
    added = air_ms - base
    conditions = (f"{n_episodes} episodes of the three embedded agent types, scripted agent (no LLM in the loop), "
                  f"{args.rounds} interleaved rounds, medians, one thread. The goal is under 5 ms added per agent "
                  "step; the ratio is against a loop with no LLM in it, so it overstates what a user of an LLM agent "
                  "feels (an LLM call takes hundreds of ms).")
    rows = [bench_row("scripted agent + AIR (8 rules per type, no LLM): time per agent step",
                      "the same scripted loop without AIR", air_ms, base, unit="ms", added_ms_per_step=round(added, 4),
                      hook_ms=round(statistics.median(hook_ms), 4))]
    path = write_bench("air", rows, conditions=conditions, out_dir=args.out)
    print(f"{n_episodes} episodes, {args.rounds} rounds, medians, one thread")
    print(f"per agent step: {base:.3f} ms without AIR, {air_ms:.3f} ms with AIR (ratio {air_ms / base:.1f}); "
          f"added {added:.3f} ms (goal: under 5 ms); per hook call {statistics.median(hook_ms):.3f} ms")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
