"""AIR's first layer, core: what every other layer shares and that imports no other part of AIR.

- ``records``: :class:`ToolCall`, :class:`Decision`, :class:`Incident`, :class:`TraceStep`; :func:`plain`,
  :func:`safe_json` and :func:`safe_str`, which serialise the agent's values without raising;
- ``errors``: :class:`CheckError`, :class:`RuleSyntaxError`;
- ``regex``: RE2 (linear time) compilation and matching on UTF-8 bytes;
- ``text``: de-obfuscation and the normalised form taint is compared in;
- ``entities``: the addresses, links, accounts, names, amounts and identifiers in tool outputs and tasks
  (:class:`ScanLimits`: the bounded scan of one output).
"""

from __future__ import annotations

from .entities import (
    MAX_ENTITY_SCAN,
    MAX_NAMED_PER_STRING,
    MAX_OUTPUT_CHARS,
    MAX_OUTPUT_ITEMS,
    MAX_SCAN_CHARS,
    ScanLimits,
    entities,
    instruction_strings,
    mentioned,
    named_entities,
    scan_output,
    string_entities,
    string_named_entities,
    tainted_strings,
)
from .errors import CheckError, RuleSyntaxError
from .records import Decision, Incident, ToolCall, TraceStep, plain, safe_json, safe_str
from .regex import MAX_REGEX_CHARS, compile_regex, findall_utf8, spans_utf8
from .text import NormalizedStrings, canonical_amount, deobfuscate, normalize

__all__ = [
    "MAX_ENTITY_SCAN",
    "MAX_NAMED_PER_STRING",
    "MAX_OUTPUT_CHARS",
    "MAX_OUTPUT_ITEMS",
    "MAX_REGEX_CHARS",
    "MAX_SCAN_CHARS",
    "CheckError",
    "Decision",
    "Incident",
    "NormalizedStrings",
    "RuleSyntaxError",
    "ScanLimits",
    "ToolCall",
    "TraceStep",
    "canonical_amount",
    "compile_regex",
    "deobfuscate",
    "entities",
    "findall_utf8",
    "instruction_strings",
    "mentioned",
    "named_entities",
    "normalize",
    "plain",
    "safe_json",
    "safe_str",
    "scan_output",
    "spans_utf8",
    "string_entities",
    "string_named_entities",
    "tainted_strings",
]
