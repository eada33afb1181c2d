"""AIR's fifth layer, eradicate: synthesise a prevention rule from an incident (template, lifting, LLM), and
accept it only if the validator does.

Modules: ``template``, ``lifting``, ``invariant``, ``llm_synth``, ``validator``. Benign corpora are passed in (the
validator's ``benign_traces``), never imported: the worlds layer records them
(:func:`icml26.air.worlds.corpus.benign_corpus`).

:class:`TemplateSynthesizer` keeps the incident rule's conditions that already held *before* the harmful call
(evaluated on the recorded pre-action view: the call, the state before it, the context) and that read neither the
result nor the post-action snapshot, and turns them into ``before_action(<scope>) ... contain - block``. When none
holds it falls back to the call's exact arguments (a rule that will not generalise; the validator decides). With
``lift=True`` it lifts the incident's constants to classes (:func:`lift_constants`: any program of the effect class,
any party the user never named, any path under a protected root, any tool of the effect class) and offers the lifted
rule first and the constant-bound one second (:meth:`TemplateSynthesizer.candidates`); the incident rule's own checks
follow the lifted ones only while the rule stays within ``max_checks`` (the validator's budget). With
``post_state=True`` it first offers the state-invariant template (:func:`post_state_rule`, issue #49 item 5): when
a check of the incident rule held only *after* the call (a burner on with nothing on it), the rule's checks are
rewritten to hold on the state the call is predicted to leave (:func:`call_effects` learns the call's effect on
the records its arguments name from the incident's own state diff; :func:`post_condition` is the weakest
precondition), and run ``before_action`` on the same tool.
:class:`LLMSynthesizer` asks an LLM for one JSON object following :data:`RULE_SCHEMA` (structured output), builds
the rule with :func:`rule_from_json` (never executes anything) and falls back to the template.

:class:`RuleValidator` accepts a candidate only if it (a) round-trips through the parser, (b) is prevention-only
(``before_action`` + ``block``: it can never widen what is allowed) within the predicate budget, (c) fires when the
incident's pre-action step is replayed, and (d) fires on at most ``fp_threshold`` of the benign traces.

Example:
    >>> from icml26.air.dsl import parse
    >>> from icml26.air.core import TraceStep
    >>> rule = parse('rule r on before_action(x) detect : call.args.a == 1 contain - block end')[0]
    >>> v = RuleValidator(benign_traces=[[TraceStep({"name": "x", "args": {"a": 2}}, {}, {})]])
    >>> v.fp_rate(rule, __import__("icml26.air.dsl", fromlist=["Evaluator"]).Evaluator())
    0.0
"""

from __future__ import annotations

from .invariant import Effect, call_effects, post_condition, post_state_rule
from .lifting import lift_constants
from .llm_synth import (
    PROMPT,
    RULE_SCHEMA,
    STRUCTURED_PROMPT,
    LLMSynthesizer,
    json_from_answer,
    rule_from_answer,
    rule_from_json,
)
from .template import TemplateSynthesizer
from .validator import RuleValidator, ValidationResult

__all__ = [
    "PROMPT",
    "RULE_SCHEMA",
    "STRUCTURED_PROMPT",
    "Effect",
    "LLMSynthesizer",
    "RuleValidator",
    "TemplateSynthesizer",
    "ValidationResult",
    "call_effects",
    "json_from_answer",
    "lift_constants",
    "post_condition",
    "post_state_rule",
    "rule_from_answer",
    "rule_from_json",
]
