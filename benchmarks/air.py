"""AIR: responder overhead per agent step (no LLM calls) against the same loop without AIR, one run.

1. Every scenario of the three embedded agent types (240 episodes) runs with the scripted agent, once without a
   responder and once with the full AIR rules (detection, containment, direct recovery, template eradication).
   Per-step time = episode wall time / agent steps.
2. AgentDojo's workspace suite (its largest state, about 113 KB as AIR sees it): every user task's ground-truth
   tool calls through AgentDojo's own ``FunctionsRuntime`` (results to text as its pipeline does), once bare and
   once inside AIR's hooks
   (``before_step``, ``before_action``, ``after_action``) with the adapter's state provider (``DictState(
   StateView(env, runtime, defer=True), cache=True)``: copy-on-write views, re-dumped after a call only in the
   environment fields the call can reach and not at all after a call of a tool that changes nothing; a snapshot
   is built when first read or before a call that can change the environment, announced with ``before_call``
   as the adapter does), three times: with the banking and slack rules (the
   earlier benchmark's setting), with the generic rules over the workspace manifest (what the AgentDojo v2
   protocol runs; their false positives on benign ground truth make incidents, whose evidence is bound too), and
   with the banking and slack rules and ``named_entities=False``. One responder per round runs every task as an
   episode (``begin``), as the adapter's evaluation does, so its per-rule analyses are not rebuilt for each task.
   Per-call time = task wall time / tool calls (environment loading excluded). Each task runs bare and with AIR
   back to back (alternating which goes first), so drifts in the shared machine's speed fall on both arms; the
   added time is the median over rounds of the paired difference. The objects alive before a timed task (the
   loaded environment: about 330 000, which AgentDojo's YAML loading makes) are frozen out of the cyclic
   collector's scans while it runs (``gc.freeze``): collections in the timed region still run, over what the calls
   and AIR allocate, but a full collection over the harness's heap (about 0.2 s) no longer lands in whichever arm
   happens to cross the threshold. ``first_call_hook_ms`` and ``later_call_hook_ms``: AIR's hooks on an episode's
   first call and on its later calls, by the hooks' own clock.

``--rounds`` interleaved repeats, medians, one thread.
Writes ``results/air/bench.json`` (the README's benchmark table is generated from it by ``icml26 report``).
Run: ``.venv/bin/python benchmarks/air.py``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

from icml26.air import builtin_rules
from icml26.air.dsl import RuleSet
from icml26.air.envs import AGENT_TYPES, scenarios
from icml26.air.experiment import run_episode
from icml26.air.runtime import DictState, IncidentResponder
from icml26.air.synth import RuleValidator, TemplateSynthesizer
from icml26.common.bench import bench_row, write_bench
from icml26.common.repro import set_threads


def agentdojo_workspace(rounds: int, generic: bool = False, named: bool = True
                        ) -> tuple[float, float, float, float, float, float]:
    """``(ms per tool call with AIR, without, added, state KB, hook ms on an episode's first call, on its later
    calls)`` on AgentDojo's workspace suite (medians over rounds; ``added``: the median of the rounds' paired
    differences);
    ``generic``: the generic rules over the workspace manifest instead of the banking and slack rules;
    ``named``: the responder's ``named_entities`` (names, amounts and identifiers in the taint)."""
    import json

    from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suite

    from icml26.air.core import ToolCall
    from icml26.air.integrations.agentdojo import BENCHMARK_VERSION, StateView, _fast_yaml, view

    _fast_yaml()  # the environment loads with libyaml's loader (outside the timing), as the adapter's evaluation
    suite = get_suite(BENCHMARK_VERSION, "workspace")
    runtime = FunctionsRuntime(suite.tools)
    from icml26.air.manifest import AGENTDOJO

    manifest = AGENTDOJO["workspace"] if generic else None
    rules = (
        builtin_rules("generic")
        if generic
        else RuleSet([*builtin_rules("agentdojo_banking"), *builtin_rules("agentdojo_slack")])
    )
    tasks = [suite.user_tasks[k] for k in sorted(suite.user_tasks, key=lambda k: int(k.rsplit("_", 1)[-1]))]
    state_kb = len(json.dumps(view(suite.load_and_inject_default_environment({})))) / 1024
    per_call: dict[str, list[float]] = {"without AIR": [], "with AIR": []}
    added: list[float] = []
    first_later: list[tuple[float, float]] = []  # hook time on an episode's first call and on its later calls
    for r in range(rounds):
        total, calls = {"without AIR": 0.0, "with AIR": 0.0}, 0
        hooks: tuple[list[float], list[float]] = ([], [])
        # one responder for the whole suite, an episode per task (as the adapter's evaluation runs it)
        air = IncidentResponder(rules, DictState(dict), manifest=manifest, named_entities=named)
        for i, ut in enumerate(tasks):
            # each task runs bare and with AIR back to back, in alternating order: drifts in the machine's speed
            # (a shared 2-core machine) fall on both arms alike
            for arm in ("without AIR", "with AIR") if (i + r) % 2 == 0 else ("with AIR", "without AIR"):
                with_air = arm == "with AIR"
                env = suite.load_and_inject_default_environment({})
                plan = list(ut.ground_truth(env))
                state = None
                if with_air:
                    state = StateView(env, runtime, defer=True)  # as the adapter (AIRToolsExecutor)
                    air.state = DictState(state, cache=True)
                    air.begin(ut.PROMPT)
                gc.freeze()  # the collector's scans skip what was alive before the task (the loaded environment)
                t0 = time.perf_counter()
                for k, fc in enumerate(plan):
                    n_hooks = len(air.timings) if with_air else 0
                    call = ToolCall(fc.function, dict(fc.args))
                    if with_air:
                        air.before_step()
                        if not air.before_action(call).allowed:
                            continue
                    if with_air:
                        state.before_call(fc.function)
                    result, error = runtime.run_function(env, fc.function, dict(fc.args))
                    text = tool_result_to_str(result) if error is None else f"error: {error}"  # as the pipeline
                    if with_air:
                        state.touched(fc.function)
                        air.after_action(call, text)
                        hooks[k > 0].append(1000 * sum(air.timings[n_hooks:]))  # the hooks' own clock
                total[arm] += time.perf_counter() - t0
                gc.unfreeze()
            calls += len(plan)
        for arm in per_call:
            per_call[arm].append(1000 * total[arm] / max(calls, 1))
        added.append(per_call["with AIR"][-1] - per_call["without AIR"][-1])
        first_later.append((statistics.mean(hooks[0]), statistics.mean(hooks[1])))
    return (statistics.median(per_call["with AIR"]), statistics.median(per_call["without AIR"]),
            statistics.median(added), state_kb, statistics.median([f for f, _ in first_later]),
            statistics.median([la for _, la in first_later]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
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
                    air = IncidentResponder(
                        builtin_rules(agent),
                        DictState(dict),
                        synthesizer=TemplateSynthesizer(),
                        validator=RuleValidator([]),
                    )
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
    conditions = (
        f"{n_episodes} episodes of the three embedded agent types, scripted agent (no LLM in the loop), "
        f"{args.rounds} interleaved rounds, medians, one thread. The goal is under 5 ms added per agent "
        "step; the ratio is against a loop with no LLM in it, so it overstates what a user of an LLM agent "
        "feels (an LLM call takes hundreds of ms)."
    )
    rows = [
        bench_row(
            "scripted agent + AIR (8 rules per type, no LLM): time per agent step",
            "the same scripted loop without AIR",
            air_ms,
            base,
            unit="ms",
            added_ms_per_step=round(added, 4),
            hook_ms=round(statistics.median(hook_ms), 4),
        )
    ]
    # the workspace settings, in this order: the earlier benchmark's rules, the generic rules, no entity scan
    workspace = [
        ("", "", {}),
        (", generic rules + manifest", "generic rules + manifest", {"generic": True}),
        (", named_entities=False", "named_entities=False", {"named": False}),
    ]
    measured = []
    for suffix, label, kwargs in workspace:
        ws_air, ws_base, ws_added, ws_kb, ws_first, ws_later = agentdojo_workspace(args.rounds, **kwargs)
        measured.append((label, ws_air, ws_base, ws_added, ws_kb))
        rows.append(
            bench_row(
                f"AgentDojo workspace, ground-truth tool calls + AIR hooks{suffix}: time per tool call",
                "the same tool calls through AgentDojo's runtime without AIR",
                ws_air,
                ws_base,
                unit="ms",
                added_ms_per_call=round(ws_added, 4),
                first_call_hook_ms=round(ws_first, 4),
                later_call_hook_ms=round(ws_later, 4),
                state_kb=round(measured[0][4], 1),
            )
        )
    conditions += (
        " AgentDojo workspace: every user task's ground-truth calls, with the banking and slack rules, with the "
        "generic rules over the workspace manifest, and with the banking and slack rules without the named-entity "
        "taint (named_entities=False: addresses, links, domains and accounts only); the adapter's cached state view "
        "(DictState(StateView(..., defer=True), cache=True): after a call only the environment fields the call can "
        "reach are dumped again, none after a tool that changes nothing, and a snapshot is built when first read or "
        "before a call that can change the environment; one responder per round, an episode per "
        "task, as the adapter's evaluation; each task bare and with AIR back to back, alternating which goes first; "
        "added = median over rounds of the paired difference; the objects alive before each timed task (the loaded "
        "environment) frozen out of the cyclic collector's scans during it (gc.freeze), so a 0.2 s collection over "
        "the harness's heap does not land in one arm; first_call_hook_ms / later_call_hook_ms: the hooks' own time "
        "on an episode's first call and on its later calls; the goal is under "
        "1 ms added per call)."
    )
    path = write_bench("air", rows, conditions=conditions, out_dir=args.out)
    print(f"{n_episodes} episodes, {args.rounds} rounds, medians, one thread")
    print(
        f"per agent step: {base:.3f} ms without AIR, {air_ms:.3f} ms with AIR (ratio {air_ms / base:.1f}); "
        f"added {added:.3f} ms (goal: under 5 ms); per hook call {statistics.median(hook_ms):.3f} ms"
    )
    for label, ws_air, ws_base, ws_added, ws_kb in measured:
        head = f"  {label}:" if label else f"AgentDojo workspace ({ws_kb:.0f} KB state):"
        print(
            f"{head} {ws_base:.3f} ms per tool call without AIR, {ws_air:.3f} ms with AIR; added "
            f"{ws_added:.3f} ms (goal: under 1 ms)"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
