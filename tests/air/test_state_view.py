"""StateView (issue #36 item 7, overhead): the field-by-field re-dump equals a fresh full view after every call.

The oracle is AgentDojo's own ``env.model_dump(mode="json")`` after each ground-truth call of every user task and
every injection task of every suite (a tool that writes a field it does not declare, e.g. ``get_unread_emails``
marking mails read, would make the views differ)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("agentdojo")

from icml26.air.integrations.agentdojo import (
    BENCHMARK_VERSION,
    UNCHANGING_TOOLS,
    AIRToolsExecutor,
    StateView,
    _fast_yaml,
    view,
)

SUITES = ("workspace", "banking", "slack", "travel")


def _replay(suite, runtime, task, every: int) -> int:
    """Run ``task``'s ground truth on a fresh environment; compare the incremental view with a full dump after
    every ``every``-th call (views skipped in between accumulate the fields to re-dump). Returns the calls run."""
    env = suite.load_and_inject_default_environment({})
    sv = StateView(env, runtime)
    assert sv() == env.model_dump(mode="json")
    calls = list(task.ground_truth(env))
    for i, fc in enumerate(calls, 1):
        runtime.run_function(env, fc.function, dict(fc.args))
        sv.touched(fc.function)
        if i % every == 0 or i == len(calls):
            before = sv._last
            now = sv()
            assert now == env.model_dump(mode="json"), (task.ID, i, fc.function)
            assert view(env) == now
            reach = sv._reach.get(fc.function)
            if every == 1 and reach is not None:  # the fields the call cannot reach are shared, not re-dumped
                assert all(sv._last[k] is before[k] for k in before if k not in reach)
            if every == 1 and fc.function in UNCHANGING_TOOLS:  # nothing is dumped again
                assert all(sv._last[k] is before[k] for k in before)
    return len(calls)


@pytest.mark.parametrize("suite_name", SUITES)
def test_incremental_view_equals_full_view_on_every_ground_truth(suite_name):
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suite

    _fast_yaml()
    suite = get_suite(BENCHMARK_VERSION, suite_name)
    runtime = FunctionsRuntime(suite.tools)
    n = 0
    for every in (1, 2):
        for tasks in (suite.user_tasks, suite.injection_tasks):
            for task in tasks.values():
                n += _replay(suite, runtime, task, every)
    assert n > 0


def test_doubt_means_a_full_dump():
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suite

    _fast_yaml()
    suite = get_suite(BENCHMARK_VERSION, "banking")
    runtime = FunctionsRuntime(suite.tools)
    env = suite.load_and_inject_default_environment({})
    sv = StateView(env, runtime)
    first = sv()
    env.bank_account.balance += 1.0  # a change no noted call made: the view is dumped whole
    second = sv()
    assert second["bank_account"]["balance"] == first["bank_account"]["balance"] + 1.0
    assert all(dict.__getitem__(second, k) is not dict.__getitem__(first, k) for k in first)
    sv.touched("no_such_tool")  # a tool the runtime does not know: everything again
    third = sv()
    assert all(dict.__getitem__(third, k) is not dict.__getitem__(second, k) for k in second)
    assert StateView(env)() == env.model_dump(mode="json")  # no runtime: always a full dump


def test_adapter_uses_the_incremental_view():
    from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suite
    from agentdojo.types import ChatAssistantMessage

    from icml26.air import builtin_rules
    from icml26.air.runtime import DictState, IncidentResponder

    _fast_yaml()
    suite = get_suite(BENCHMARK_VERSION, "banking")
    runtime = FunctionsRuntime(suite.tools)
    env = suite.load_and_inject_default_environment({})
    air = IncidentResponder(builtin_rules("agentdojo_banking"), DictState(dict))
    ex = AIRToolsExecutor(air)
    call = FunctionCall(function="get_balance", args={}, id="1")
    msg = ChatAssistantMessage(role="assistant", content=None, tool_calls=[call])
    ex.query("what is my balance?", runtime, env, [msg])
    assert isinstance(ex._view, StateView)
    assert air.state.view() == env.model_dump(mode="json")


# arguments for the read-only tools no ground truth of their suite calls (the others take the ground truths' own)
_ARGS = {
    "search_contacts_by_email": {"query": "@"},
    "get_file_by_id": {"file_id": "0"},
    "get_contact_information_for_restaurants": {"restaurant_names": ["Le Baratin", "New Israeli Restaurant"]},
    "get_car_rental_address": {"company_name": ["SunSet Rent-A-Car", "Paris Rent-a-Car"]},
    "search_calendar_events": {"query": "a"},
    "get_day_calendar_events": {"day": "2024-05-15"},
}


@pytest.mark.parametrize("suite_name", SUITES)
def test_unchanging_tools_change_nothing(suite_name):
    """Every AgentDojo tool listed as unchanging leaves the environment's dump as it was, with every argument set a
    ground truth of the suite gives it (or one from ``_ARGS``); the suite's other read-only tools are listed because
    they do change it (``get_unread_emails`` marks mails read, ``get_webpage`` logs the request)."""
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suite

    from icml26.air.policy.manifest import AGENTDOJO

    _fast_yaml()
    suite = get_suite(BENCHMARK_VERSION, suite_name)
    runtime = FunctionsRuntime(suite.tools)
    args: dict[str, list[dict]] = {}
    for tasks in (suite.user_tasks, suite.injection_tasks):
        for task in tasks.values():
            for fc in task.ground_truth(suite.load_and_inject_default_environment({})):
                args.setdefault(fc.function, []).append(dict(fc.args))
    manifest = AGENTDOJO[suite_name]
    read_only = {name for name in runtime.functions if manifest.read_only(name)}
    assert read_only - UNCHANGING_TOOLS <= {"get_unread_emails", "get_webpage"}
    checked = 0
    for name in sorted(read_only):
        for a in args.get(name) or [_ARGS.get(name, {})]:
            env = suite.load_and_inject_default_environment({})
            before = env.model_dump(mode="json")
            runtime.run_function(env, name, dict(a))
            changed = env.model_dump(mode="json") != before
            assert changed == (name not in UNCHANGING_TOOLS), (name, a)
            checked += 1
    assert checked >= len(read_only)


def _run_episode(suite, runtime, task, defer: bool):
    """``task``'s ground truth with the generic rules through a (deferring or not) StateView, as the adapter runs
    calls; returns decisions, incidents (rule, phase, evidence diff) and the trace's states as plain dicts."""
    from icml26.air import builtin_rules
    from icml26.air.core import ToolCall
    from icml26.air.policy.manifest import AGENTDOJO
    from icml26.air.runtime import DictState, IncidentResponder

    env = suite.load_and_inject_default_environment({})
    sv = StateView(env, runtime, defer=defer)
    air = IncidentResponder(builtin_rules("generic"), DictState(sv, cache=True),
                            manifest=AGENTDOJO[suite.name])

    def execute(call):
        sv.before_call(call.name)
        result, _error = runtime.run_function(env, call.name, dict(call.args))
        sv.touched(call.name)
        return result

    air.begin(task.PROMPT, executor=execute)
    decisions = []
    for fc in task.ground_truth(env):
        call = ToolCall(fc.function, dict(fc.args))
        d = air.before_step()
        if d.allowed:
            d = air.before_action(call)
        decisions.append(d.kind)
        if not d.allowed:
            continue
        sv.before_call(fc.function)
        result, error = runtime.run_function(env, fc.function, dict(fc.args))
        sv.touched(fc.function)
        decisions.append(air.after_action(call, str(result) if error is None else error).kind)
    air.finish()
    incidents = [(i.rule, i.phase, i.evidence["diff"], i.remediated) for i in air.incidents]
    return _no_clock((decisions, incidents, [dict(s.state) for s in air.trace]))


_NOW = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?$")  # any ISO timestamp: datetime.now() among them


def _no_clock(v):
    """``v`` with its timestamps replaced: AgentDojo's tools take some from the clock (sending an invitation), so
    two runs of one episode differ in them (both runs are masked alike)."""
    if isinstance(v, str):
        return "<now>" if _NOW.match(v) else v
    if isinstance(v, dict):
        return {k: _no_clock(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return type(v)(_no_clock(x) for x in v)
    return v


@pytest.mark.parametrize("suite_name", SUITES)
def test_deferred_snapshots_give_the_same_episodes(suite_name):
    """Snapshots built when first read (defer=True, as the adapter runs) give every user task's episode with the
    generic rules exactly as snapshots dumped when taken: decisions, incidents with their evidence, trace states."""
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suite

    _fast_yaml()
    suite = get_suite(BENCHMARK_VERSION, suite_name)
    runtime = FunctionsRuntime(suite.tools)
    for task in suite.user_tasks.values():
        assert _run_episode(suite, runtime, task, True) == _run_episode(suite, runtime, task, False), task.ID


def test_a_deferred_snapshot_read_late_is_the_state_when_taken():
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suite

    _fast_yaml()
    suite = get_suite(BENCHMARK_VERSION, "workspace")
    runtime = FunctionsRuntime(suite.tools)
    for task in list(suite.user_tasks.values())[:12]:
        env = suite.load_and_inject_default_environment({})
        sv = StateView(env, runtime, defer=True)
        taken = []
        for fc in task.ground_truth(env):
            snap = sv.deferred()
            assert sv.deferred() is snap and not snap.built      # one waiting snapshot per state
            taken.append((snap, env.model_dump(mode="json")))
            sv.before_call(fc.function)
            assert snap.built == (fc.function not in UNCHANGING_TOOLS)  # built before a call that can change
            runtime.run_function(env, fc.function, dict(fc.args))
            sv.touched(fc.function)
        for snap, then in taken:                                   # read after the whole episode
            assert dict(snap) == then


def test_an_unannounced_changing_call_with_a_waiting_snapshot_raises():
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suite

    _fast_yaml()
    suite = get_suite(BENCHMARK_VERSION, "banking")
    runtime = FunctionsRuntime(suite.tools)
    env = suite.load_and_inject_default_environment({})
    sv = StateView(env, runtime, defer=True)
    sv.deferred()
    sv.touched("get_balance")  # changes nothing: the snapshot still holds
    with pytest.raises(RuntimeError, match="before_call"):
        sv.touched("send_money")
    assert StateView(env, runtime).deferred() == env.model_dump(mode="json")  # defer=False: the view itself
