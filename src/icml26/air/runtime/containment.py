"""AIR's runtime layer, containment: an incident's pre-action checks as a blocking rule, and replay."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..core.errors import CheckError
from ..core.records import Incident, TraceStep, safe_str
from ..dsl import Action, Cond, Evaluator, Rule, Trigger, mentions_root


def pre_action_safe(c: Any) -> bool:
    """Whether a condition can be evaluated before an action (reads neither ``result`` nor ``snap``)."""
    return not mentions_root(c, {"result", "snap", "incident"})


def pre_action_env(inc: Incident) -> dict[str, Any] | None:
    """The bindings of the step before the incident's harmful call (call, state, context; None: none recorded)."""
    if inc.pre_bindings is None:
        return None
    return dict(inc.pre_bindings)


def holds_before(evaluator: Evaluator, c: Cond, env: dict[str, Any]) -> bool:
    """Whether ``c`` held before the harmful call; a check that cannot be decided (a ``semantic(...)`` backend that
    fails, times out, answers no boolean or raises anything, issue #48) is logged in ``evaluator.errors`` and
    dropped, never raised (predicate failures are already logged by the evaluator)."""
    try:
        return evaluator(c, env)
    except Exception as exc:          # CheckError, and whatever a backend raises (ValueError, RecursionError, ...)
        kind = "" if isinstance(exc, CheckError) else f"{type(exc).__name__}: "
        evaluator.errors.append(f"check skipped while synthesising a rule: {kind}{safe_str(exc)}")
        return False


def pre_action_checks(rule: Rule, evaluator: Evaluator, env: dict[str, Any]) -> list[Cond]:
    """The incident rule's ``when`` and ``detect`` checks that can run before an action (:func:`pre_action_safe`)
    and held on the pre-action bindings ``env``, in rule order."""
    return [c for c in (*([rule.when] if rule.when else []), *rule.detect)
            if pre_action_safe(c) and holds_before(evaluator, c, env)]


def prevention_scope(rule: Rule, call: dict[str, Any]) -> tuple[str, int]:
    """``(scope, limit)`` of a prevention rule made from ``rule``'s incident: the tool glob it triggers on (the
    rule's ``eradicate scope``, else the incident call's tool) and the most checks it keeps (``max_predicates``)."""
    scope = rule.eradicate.scope if rule.eradicate and rule.eradicate.scope else call["name"]
    limit = rule.eradicate.max_predicates if rule.eradicate else 4
    return scope, limit


def prevention_rule(inc: Incident, rule: Rule, evaluator: Evaluator, *, provenance: str = "template") -> Rule | None:
    """``<rule>__prevent``: ``before_action(<scope>)`` with the incident rule's pre-action checks that held
    (:func:`pre_action_checks`, at most ``limit``), ``contain - block``; None without a pre-action step or when no
    check held. Containment keeps it for the rest of the episode (as ``<rule>__contain``); eradication's template
    (``eradicate.TemplateSynthesizer``) starts from the same checks."""
    env = pre_action_env(inc)
    if env is None or env.get("call") is None:
        return None
    scope, limit = prevention_scope(rule, env["call"])
    conds = pre_action_checks(rule, evaluator, env)
    if not conds:
        return None
    return Rule(name=f"{rule.name}__prevent", triggers=(Trigger("before_action", (scope,)),),
                detect=tuple(conds[:limit]), severity=rule.severity, contain=(Action("block"),),
                provenance=provenance)


def replay(trace: Iterable[TraceStep], rules: Sequence[Rule], evaluator: Evaluator) -> list[tuple[int, str]]:
    """The (step, rule) pairs where ``before_action`` rules fire on a recorded trace."""
    out = []
    for i, step in enumerate(trace):
        env = {"call": step.call, "state": step.state, "ctx": step.ctx, "result": None,
               "snap": {"pre_step": step.state}}
        for r in rules:
            if r.fires_on("before_action", step.call["name"]) and (r.when is None or evaluator(r.when, env)) and all(
                    evaluator(c, env) for c in r.detect):
                out.append((i, r.name))
    return out
