"""AIR's eradicate layer, the template: a prevention rule from the incident rule's pre-action checks (and, with
``post_state``, from the checks that hold only after the call: :mod:`.invariant`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.records import Incident
from ..dsl import Action, Cond, Evaluator, Lit, Path_, Rule, Trigger, count_checks
from ..policy.predicates import PROTECTED_ROOTS
from ..runtime.containment import pre_action_checks, pre_action_env, prevention_scope
from .invariant import post_state_rule
from .lifting import _binds_argument_constant, lift_constants


class TemplateSynthesizer:
    """Prevention rules from the incident rule's pre-action conditions (see the package docstring).

    ``post_state=True`` adds, first among the candidates, the state-invariant template
    (:func:`~icml26.air.eradicate.invariant.post_state_rule`): the incident rule's checks on the state the call
    is predicted to leave, offered when one of them held only after the call (a broken invariant).
    """

    name = "template"

    def __init__(self, *, fallback_to_arguments: bool = True, lift: bool = False, manifest: Any = None,
                 protected_roots: Sequence[str] | None = None, max_checks: int = 10, post_state: bool = False):
        if not isinstance(max_checks, int) or max_checks < 1:
            raise ValueError(f"max_checks must be a positive int, got {max_checks!r}")
        if not isinstance(post_state, bool):
            raise TypeError(f"post_state must be a bool, got {type(post_state).__name__}")
        self.fallback_to_arguments, self.max_checks, self.post_state = fallback_to_arguments, max_checks, post_state
        self.lift, self.manifest = lift, manifest
        if protected_roots is None:
            protected_roots = PROTECTED_ROOTS
        if isinstance(protected_roots, str) or not all(isinstance(r, str) and r for r in protected_roots):
            raise TypeError("protected_roots must be a sequence of non-empty strings")
        self.protected_roots = tuple(protected_roots)

    def candidates(self, inc: Incident, rule: Rule, evaluator: Evaluator) -> list[Rule]:
        """The candidates the responder validates in order: with ``post_state``, the state-invariant rule first
        (when the incident broke an invariant); then with ``lift``, the lifted rule, then the constant-bound
        template (kept when the lifted rule fires on benign traces); else the template alone."""
        inv = post_state_rule(inc, rule, evaluator, max_checks=self.max_checks) if self.post_state else None
        head = [] if inv is None else [inv]
        first = self.synthesize(inc, rule, evaluator)
        if not self.lift:
            return head + ([] if first is None else [first])
        plain = TemplateSynthesizer(fallback_to_arguments=self.fallback_to_arguments).synthesize(inc, rule, evaluator)
        out = [r for r in (first, plain) if r is not None]
        return head + (out[:1] if len(out) == 2 and out[0].detect == out[1].detect else out)

    def synthesize(self, inc: Incident, rule: Rule, evaluator: Evaluator) -> Rule | None:
        env = pre_action_env(inc)
        if env is None or env.get("call") is None:
            return None
        call = env["call"]
        scope, limit = prevention_scope(rule, call)
        conds = pre_action_checks(rule, evaluator, env)     # the incident rule's checks that held before the call
        if self.lift:
            lifted, scope_l = lift_constants(call, env, evaluator, manifest=self.manifest,
                                             protected_roots=self.protected_roots)
            if lifted:
                # the incident rule's own checks that tie a call argument to a constant are replaced by the lifted
                # classes; its other checks (the user's task, the state, the effect classes) are kept
                kept = [c for c in conds if not _binds_argument_constant(c)]
                # the incident rule's kept checks follow the lifted ones only while the rule stays within the
                # validator's check budget (``max_checks``, RuleValidator's ``max_predicates``): a longer candidate
                # is rejected unseen (issue #36, fourth pass: README, Deviations 13)
                while kept and count_checks([*lifted, *kept]) > self.max_checks:
                    kept.pop()
                conds, scope = [*lifted, *kept], scope_l if scope_l is not None else scope
                limit = max(limit, len(lifted))
        if not conds and self.fallback_to_arguments:
            conds = [Cond("compare", (Path_("call", ("args", k)), Lit(v)), "==")
                     for k, v in sorted(call["args"].items()) if isinstance(v, str | int | float | bool)]
        if not conds:
            return None
        return Rule(name=f"{rule.name}__prevent", triggers=(Trigger("before_action", (scope,)),),
                    detect=tuple(conds[:limit]), severity=rule.severity, contain=(Action("block"),),
                    provenance=self.name)
