"""Eradication: synthesise a prevention rule from an incident, and accept it only if it validates.

:class:`TemplateSynthesizer` keeps the incident rule's conditions that already held *before* the harmful call
(evaluated on the recorded pre-action view: the call, the state before it, the context) and that read neither the
result nor the post-action snapshot, and turns them into ``before_action(<scope>) ... contain - block``. When none
holds it falls back to the call's exact arguments (a rule that will not generalise; the validator decides).
:class:`LLMSynthesizer` asks an LLM for rule text, parses it (never executes it) and falls back to the template.

:class:`RuleValidator` accepts a candidate only if it (a) round-trips through the parser, (b) is prevention-only
(``before_action`` + ``block``: it can never widen what is allowed) within the predicate budget, (c) fires when the
incident's pre-action step is replayed, and (d) fires on at most ``fp_threshold`` of the benign traces.

Example:
    >>> from icml26.air.dsl import parse
    >>> from icml26.air.responder import TraceStep
    >>> rule = parse('rule r on before_action(x) detect : call.args.a == 1 contain - block end')[0]
    >>> v = RuleValidator(benign_traces=[[TraceStep({"name": "x", "args": {"a": 2}}, {}, {})]])
    >>> v.fp_rate(rule, __import__("icml26.air.dsl", fromlist=["Evaluator"]).Evaluator())
    0.0
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .dsl import (
    Action,
    CheckError,
    Cond,
    Evaluator,
    Lit,
    Path_,
    Rule,
    RuleSyntaxError,
    Trigger,
    count_predicates,
    parse,
)
from .llm import LLMClient, LLMError
from .responder import Incident, TraceStep, pre_action_safe, replay


def _pre_env(inc: Incident) -> dict[str, Any] | None:
    if inc.pre_bindings is None:
        return None
    return dict(inc.pre_bindings)


class TemplateSynthesizer:
    """Prevention rules from the incident rule's pre-action conditions (see the module docstring)."""

    name = "template"

    def __init__(self, *, fallback_to_arguments: bool = True):
        self.fallback_to_arguments = fallback_to_arguments

    def synthesize(self, inc: Incident, rule: Rule, evaluator: Evaluator) -> Rule | None:
        env = _pre_env(inc)
        if env is None or env.get("call") is None:
            return None
        call = env["call"]
        scope = rule.eradicate.scope if rule.eradicate and rule.eradicate.scope else call["name"]
        limit = rule.eradicate.max_predicates if rule.eradicate else 4
        conds = [c for c in (*([rule.when] if rule.when else []), *rule.detect)
                 if pre_action_safe(c) and _holds(evaluator, c, env)]
        if not conds and self.fallback_to_arguments:
            conds = [Cond("compare", (Path_("call", ("args", k)), Lit(v)), "==")
                     for k, v in sorted(call["args"].items()) if isinstance(v, str | int | float | bool)]
        if not conds:
            return None
        return Rule(name=f"{rule.name}__prevent", triggers=(Trigger("before_action", (scope,)),),
                    detect=tuple(conds[:limit]), severity=rule.severity, contain=(Action("block"),),
                    provenance=self.name)


def _holds(evaluator: Evaluator, c: Cond, env: dict[str, Any]) -> bool:
    """Whether ``c`` held before the harmful call; a ``semantic(...)`` check whose LLM fails is logged and dropped
    (predicate failures are already logged by the evaluator)."""
    try:
        return evaluator(c, env)
    except CheckError as exc:
        evaluator.errors.append(f"semantic check skipped while synthesising a rule: {exc}")
        return False


PROMPT = """You write guardrail rules in the AIR rule language. An incident happened:

rule that detected it: {rule}
the agent's call before the harm: {call}
the user's task: {task}

Write ONE prevention rule that blocks such calls before they run, in exactly this form:

rule NAME
on before_action(TOOL)
detect
  : CONDITION
  : CONDITION
contain
  - block
end

Conditions may use call.name, call.args.X, state.X (before the call), ctx.user_task,
ctx.strings_from_tool_outputs, ctx.user_mentioned_addresses, comparisons (== != < > <= >=), `X matches "regex"`,
`X in Y`, `not`, `and`, `or`, and these predicates: {predicates}. Answer with the rule only."""


class LLMSynthesizer:
    """Rule text from an LLM, parsed (never executed); the template when the answer does not parse or validate."""

    name = "llm"

    def __init__(self, llm: LLMClient, fallback: Any = None):
        self.llm = llm
        self.fallback = fallback if fallback is not None else TemplateSynthesizer()
        self.failures: list[str] = []

    def synthesize(self, inc: Incident, rule: Rule, evaluator: Evaluator) -> Rule | None:
        env = _pre_env(inc)
        if env is None or env.get("call") is None:
            return self.fallback.synthesize(inc, rule, evaluator)
        from .dsl import registered_predicates

        prompt = PROMPT.format(rule=rule.to_text(), call=env["call"], task=env["ctx"].get("user_task", ""),
                               predicates=", ".join(sorted(registered_predicates())))
        try:
            text = self.llm.complete([{"role": "user", "content": prompt}]).text
            r = rule_from_answer(text)
            return Rule(name=f"{rule.name}__llm", triggers=r.triggers, detect=r.detect, when=r.when,
                        severity=rule.severity, contain=r.contain, provenance=self.name)
        except (LLMError, RuleSyntaxError, ValueError) as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")
            fb = self.fallback.synthesize(inc, rule, evaluator)
            return None if fb is None else Rule(**{**fb.__dict__, "provenance": f"{self.name}->template"})


_FENCE = re.compile(r"```[a-zA-Z]*\n(.*?)```", re.S)
_BLOCK = re.compile(r"^[ \t]*rule[ \t]+[A-Za-z_]\w*.*?^[ \t]*end[ \t]*$", re.S | re.M)


def rule_from_answer(text: str) -> Rule:
    r"""The one rule in an LLM's answer: the first fenced block or ``rule ... end`` block (line-anchored, so prose
    before or after it, which may itself say "rule", is skipped) that parses to exactly one rule.

    Raises:
        RuleSyntaxError: no block parses (the last parse error, or "no rule ... end block").

    Example:
        >>> rule_from_answer("Here is the rule you need:\nrule r on before_action(x)\ndetect\n  : call.args.a == 1\n"
        ...                  "contain\n  - block\nend\nThis rule blocks it.").name
        'r'
    """
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [m.group(0) for m in _BLOCK.finditer(text)]
    error: RuleSyntaxError = RuleSyntaxError("no rule ... end block in the answer")
    for c in candidates:
        try:
            parsed = parse(c, file="<llm>")
        except RuleSyntaxError as exc:
            error = exc
            continue
        if len(parsed) == 1:
            return parsed[0]
        error = RuleSyntaxError(f"expected one rule, got {len(parsed)}")
    raise error


@dataclass
class ValidationResult:
    accepted: bool
    reason: str
    fp_rate: float = 0.0


class RuleValidator:
    """The eradication gate (see the module docstring).

    Args:
        benign_traces: recorded pre-action traces of benign episodes of the same agent type.
        fp_threshold: the largest share of benign traces a candidate may fire on.
        max_predicates: hard cap on checks per synthesised rule.
    """

    def __init__(self, benign_traces: Sequence[Sequence[TraceStep]] = (), *, fp_threshold: float = 0.05,
                 max_predicates: int = 10):
        if not 0 <= fp_threshold <= 1:
            raise ValueError(f"fp_threshold must be in [0, 1], got {fp_threshold}")
        self.benign_traces = benign_traces       # a live reference: traces recorded later count too
        self.fp_threshold, self.max_predicates = fp_threshold, max_predicates

    def fp_rate(self, rule: Rule, evaluator: Evaluator) -> float:
        if not self.benign_traces:
            return 0.0
        return sum(bool(replay(t, [rule], evaluator)) for t in self.benign_traces) / len(self.benign_traces)

    def validate(self, rule: Rule, inc: Incident, evaluator: Evaluator) -> ValidationResult:
        try:
            again = parse(rule.to_text(), file="<candidate>")
        except RuleSyntaxError as exc:
            return ValidationResult(False, f"does not parse: {exc}")
        if len(again) != 1 or again[0].detect != rule.detect or again[0].triggers != rule.triggers:
            return ValidationResult(False, "does not round-trip through the parser")
        if not rule.is_prevention():
            return ValidationResult(False, "not prevention-only (before_action + block)")
        if count_predicates(rule) > self.max_predicates:
            return ValidationResult(False, f"more than {self.max_predicates} checks")
        env = _pre_env(inc)
        if env is None or env.get("call") is None:
            return ValidationResult(False, "the incident has no pre-action step to replay")
        try:
            if not replay([TraceStep(env["call"], env["state"], env["ctx"])], [rule], evaluator):
                return ValidationResult(False, "does not fire on the incident's replay")
            fp = self.fp_rate(rule, evaluator)
        except CheckError as exc:
            return ValidationResult(False, f"a check cannot be decided: {exc}")
        if fp > self.fp_threshold:
            return ValidationResult(False, f"fires on {fp:.0%} of benign traces (> {self.fp_threshold:.0%})", fp)
        return ValidationResult(True, "accepted", fp)
