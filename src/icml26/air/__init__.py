"""AIR: incident response for LLM agents — a rule language, a runtime in the agent loop, eradication.

Paper: "AIR: Improving Agent Safety through Incident Response", Zibo Xiao, Jun Sun, Junjie Chen, ICML 2026.
https://arxiv.org/abs/2602.11749 (no official code; everything beyond the abstract is reconstructed).

``parse``/``load``/``lint`` read rule files (lark; never executed); ``IncidentResponder`` runs them through the
hooks ``before_step``, ``before_action``, ``after_action``, ``finish``; ``TemplateSynthesizer``/``LLMSynthesizer``
with ``RuleValidator`` eradicate; LLM clients in ``air.runtime.llm``; the embedded environments in
``air.worlds.embedded``. Needs the ``agents`` extra (lark, pydantic).

The package is layered, each layer importing only the ones before it (a test checks it, and that there is no
import cycle): ``core`` (records, errors, text normalisation, entity extraction), ``dsl`` (the rule language),
``policy`` (tool manifests, predicates, shipped rules), ``runtime`` (the responder, state views, contexts,
containment, LLM clients), ``eradicate`` (template, lifting, LLM synthesis, validator), ``integrations``
(LangChain, MCP, the AgentDojo adapter), ``worlds`` (embedded environments, the AgentDojo evaluation protocol,
benign corpora), ``experiment`` (the reproduction). This module and the modules ``air.envs``, ``air.llm``,
``air.manifest`` and ``air.synth`` (the paths documented before the split) only re-export.
"""

from __future__ import annotations

from .core.records import Decision, Incident, ToolCall, TraceStep
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
from .eradicate import LLMSynthesizer, RuleValidator, TemplateSynthesizer, ValidationResult
from .policy import predicates  # noqa: F401  (registers the whitelisted predicates)
from .policy.rules import builtin_rules
from .runtime import DictState, IncidentResponder, replay

__all__ = ["Decision", "Diagnostic", "DictState", "Incident", "IncidentResponder", "LLMSynthesizer", "Rule",
           "RuleSet", "RuleSyntaxError", "RuleValidator", "TemplateSynthesizer", "ToolCall", "TraceStep",
           "ValidationResult", "builtin_rules", "lint", "load", "parse", "predicate", "registered_predicates",
           "replay"]
