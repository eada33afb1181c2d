"""AIR: incident response for LLM agents — a rule language, a runtime in the agent loop, eradication.

Paper: "AIR: Improving Agent Safety through Incident Response", Zibo Xiao, Jun Sun, Junjie Chen, ICML 2026.
https://arxiv.org/abs/2602.11749 (no official code; everything beyond the abstract is reconstructed).

``parse``/``load``/``lint`` read rule files (lark; never executed); ``IncidentResponder`` runs them through the
hooks ``before_step``, ``before_action``, ``after_action``, ``finish``; ``TemplateSynthesizer``/``LLMSynthesizer``
with ``RuleValidator`` eradicate; LLM clients in ``air.llm``; the embedded environments in ``air.envs``.
Needs the ``agents`` extra (lark, pydantic).
"""

from __future__ import annotations

from importlib.resources import files

from . import predicates  # noqa: F401  (registers the whitelisted predicates)
from .dsl import (
    Diagnostic,
    Rule,
    RuleSet,
    RuleSyntaxError,
    lint,
    load,
    parse,
    predicate,
    registered_predicates,
)
from .responder import Decision, DictState, Incident, IncidentResponder, ToolCall, TraceStep, replay
from .synth import LLMSynthesizer, RuleValidator, TemplateSynthesizer, ValidationResult


def builtin_rules(name: str) -> RuleSet:
    """A rule file shipped with the package: ``shell``, ``email``, ``household`` (detection and response) or
    ``prevent_shell``, ``prevent_email``, ``prevent_household`` (developer prevention rules)."""
    path = files(__package__) / "rules" / f"{name}.air"
    if not path.is_file():
        raise ValueError(f"no built-in rule file {name!r}")
    return parse(path.read_text(), file=f"rules/{name}.air")


__all__ = ["Decision", "Diagnostic", "DictState", "Incident", "IncidentResponder", "LLMSynthesizer", "Rule",
           "RuleSet", "RuleSyntaxError", "RuleValidator", "TemplateSynthesizer", "ToolCall", "TraceStep",
           "ValidationResult", "builtin_rules", "lint", "load", "parse", "predicate", "registered_predicates",
           "replay"]
