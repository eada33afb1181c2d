"""AIR's eradicate layer, the validator: the gate a synthesised rule must pass before it is kept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.errors import CheckError, RuleSyntaxError
from ..core.records import Incident, TraceStep, safe_str
from ..dsl import Evaluator, Rule, count_predicates, parse
from ..runtime.containment import pre_action_env, replay


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
        env = pre_action_env(inc)
        if env is None or env.get("call") is None:
            return ValidationResult(False, "the incident has no pre-action step to replay")
        try:
            if not replay([TraceStep(env["call"], env["state"], env["ctx"])], [rule], evaluator):
                return ValidationResult(False, "does not fire on the incident's replay")
            fp = self.fp_rate(rule, evaluator)
        except Exception as exc:      # CheckError, or whatever a backend or predicate raised: not accepted
            kind = "" if isinstance(exc, CheckError) else f"{type(exc).__name__}: "
            return ValidationResult(False, f"a check cannot be decided: {kind}{safe_str(exc)}")
        if fp > self.fp_threshold:
            return ValidationResult(False, f"fires on {fp:.0%} of benign traces (> {self.fp_threshold:.0%})", fp)
        return ValidationResult(True, "accepted", fp)
