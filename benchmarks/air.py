"""AIR: responder overhead per agent step (no LLM calls) against the same scripted loop without AIR, one run.

Every scenario of the three embedded agent types (240 episodes) runs with the scripted agent, once without a
responder and once with the full AIR rules (detection, containment, direct recovery, template eradication);
``--rounds`` interleaved repeats, medians. Per-step time = episode wall time / agent steps. One thread.
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    per_step: dict[str, list[float]] = {"without AIR": [], "with AIR": []}
    hook_ms: list[float] = []
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
    print(f"240 episodes, {args.rounds} rounds, medians, one thread\n")
    print("| loop | ms per agent step | ratio |")
    print("|---|---|---|")
    print(f"| scripted agent, no AIR | {base:.3f} | 1 |")
    print(f"| scripted agent + AIR (8 rules per type, no LLM) | {air_ms:.3f} | {air_ms / base:.1f} |")
    print(f"\nAIR's added time per agent step: {air_ms - base:.3f} ms (goal: under 5 ms); "
          f"per hook call: {statistics.median(hook_ms):.3f} ms")


if __name__ == "__main__":
    main()
