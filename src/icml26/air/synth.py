"""``icml26.air.synth``: eradication (:mod:`icml26.air.eradicate`) and the benign corpus its validator is given
(:func:`icml26.air.worlds.corpus.benign_corpus`).

Kept for the path documented before AIR was split into layers (README); it only re-exports, and no AIR
module imports it.
"""

from __future__ import annotations

from .eradicate import (
    PROMPT,
    RULE_SCHEMA,
    STRUCTURED_PROMPT,
    LLMSynthesizer,
    RuleValidator,
    TemplateSynthesizer,
    ValidationResult,
    json_from_answer,
    lift_constants,
    rule_from_answer,
    rule_from_json,
)
from .worlds.corpus import benign_corpus

__all__ = [
    "PROMPT",
    "RULE_SCHEMA",
    "STRUCTURED_PROMPT",
    "LLMSynthesizer",
    "RuleValidator",
    "TemplateSynthesizer",
    "ValidationResult",
    "benign_corpus",
    "json_from_answer",
    "lift_constants",
    "rule_from_answer",
    "rule_from_json",
]
