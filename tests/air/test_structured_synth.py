"""LLM synthesis with structured output (issue #36 item 4): a JSON schema for a rule, parsed into the DSL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lark")

from icml26.air import LLMSynthesizer, RuleValidator
from icml26.air.core import TraceStep
from icml26.air.dsl import Evaluator, RuleSyntaxError
from icml26.air.eradicate import RULE_SCHEMA, json_from_answer, rule_from_json
from icml26.air.policy.manifest import EMBEDDED
from icml26.air.runtime.llm import FakeLLM

from .test_llm_synth import BENIGN as _BENIGN
from .test_llm_synth import RULE
from .test_llm_synth import _incident as _bare_incident


def _fields(call):
    return {**call, **EMBEDDED["email"].call_fields(call["name"], call["args"])}


def _incident():
    """The share-file incident with the manifest's fields bound (as the responder binds them at runtime)."""
    inc = _bare_incident()
    inc.pre_bindings["call"] = _fields(inc.pre_bindings["call"])
    inc.pre_bindings["ctx"]["known_parties"] = []
    return inc


BENIGN = [[TraceStep(_fields(s.call), s.state, {**s.ctx, "known_parties": []}) for s in t] for t in _BENIGN]

# answers in the styles models answer in (bare JSON from a json_schema server mode, a fenced block, a reasoning
# model's <think> block, prose first, the text language instead of JSON, schema violations); hand-written
TRANSCRIPTS = json.loads((Path(__file__).parent / "data" / "llm_rule_transcripts.json").read_text())


def _answer(style: str) -> str:
    return next(t["answer"] for t in TRANSCRIPTS if t["style"].startswith(style))


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=[t["style"][:40] for t in TRANSCRIPTS])
def test_transcripts(t):
    llm = FakeLLM([t["answer"]])
    synth = LLMSynthesizer(llm)
    r = synth.synthesize(_incident(), RULE, Evaluator())
    fmt = llm.response_formats[0]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == RULE_SCHEMA  # asked for JSON
    assert "JSON" in llm.prompts[0][0]["content"]
    if t["expect"] == "ok":
        assert r.provenance == "llm" and not synth.failures
        assert r.triggers[0].tools == ("*",) and "evil@x.io" not in r.to_text()
        assert RuleValidator(BENIGN).validate(r, _incident(), Evaluator()).accepted
    elif t["expect"] == "fallback":
        assert r.provenance == "llm->template" and t["error"] in synth.failures[0], synth.failures
    else:  # parses (RE2: linear time), fails validation
        assert r.provenance == "llm"
        assert not RuleValidator(BENIGN).validate(r, _incident(), Evaluator()).accepted


def test_structured_rule_generalises_to_other_addresses_and_tools():
    r = rule_from_json(json_from_answer(_answer("bare JSON")))
    ev = Evaluator()
    from icml26.air.runtime import replay

    def step(tool, args, task="summarise the page"):
        return TraceStep(
            {"name": tool, "args": args, **EMBEDDED["email"].call_fields(tool, args)},
            {},
            {"user_task": task, "known_parties": ["alice@corp.com"]},
        )

    assert replay([step("calendar.add_attendee", {"event_id": "e1", "email": "X9@Anon-Box.org "})], [r], ev)
    assert not replay([step("drive.share_file", {"file_id": "f", "email": "alice@corp.com"})], [r], ev)
    assert not replay(
        [step("drive.share_file", {"file_id": "f", "email": "bob@c.com"}, "share f with bob@c.com")], [r], ev
    )


def test_rule_from_json_errors_name_the_json_path():
    good = json.loads(_answer("bare JSON"))
    with pytest.raises(RuleSyntaxError, match=r"\$: missing \['conditions'\]"):
        rule_from_json({k: v for k, v in good.items() if k != "conditions"})
    with pytest.raises(RuleSyntaxError, match=r"\$.name"):
        rule_from_json({**good, "name": "bad name; rm"})
    with pytest.raises(RuleSyntaxError, match=r"\$.trigger.tools"):
        rule_from_json({**good, "trigger": {"phase": "before_action", "tools": []}})
    with pytest.raises(RuleSyntaxError, match=r"conditions\[0\].value|a scalar"):
        rule_from_json(
            {**good, "conditions": [{"left": {"path": "call.name"}, "op": "==", "right": {"value": {}}}]}
        )
    with pytest.raises(RuleSyntaxError, match="unknown operator"):
        rule_from_json(
            {**good, "conditions": [{"left": {"path": "call.name"}, "op": "~", "right": {"value": 1}}]}
        )
    with pytest.raises(RuleSyntaxError, match="a fresh identifier"):
        rule_from_json(
            {
                **good,
                "conditions": [
                    {
                        "quantifier": "any",
                        "var": "call",
                        "in": {"path": "call.targets"},
                        "where": {"predicate": "mentions", "args": []},
                    }
                ],
            }
        )
    deep: dict = {"predicate": "mentions", "args": []}
    for _ in range(100):
        deep = {"not": deep}
    with pytest.raises(RuleSyntaxError, match="nested deeper"):
        rule_from_json({**good, "conditions": [deep]})
    with pytest.raises(RuleSyntaxError, match="not one JSON object"):
        json_from_answer("[" * 100_000)
    with pytest.raises(RuleSyntaxError, match="longer than"):
        json_from_answer(" " * 200_000)
    with pytest.raises(RuleSyntaxError, match="JSON object"):
        rule_from_json([good])


def test_text_mode_still_available():
    good = FakeLLM(
        [
            "rule x on before_action(drive.share_file)\ndetect\n"
            "  : call.args.email in ctx.strings_from_tool_outputs\ncontain\n  - block\nend"
        ]
    )
    r = LLMSynthesizer(good, structured=False).synthesize(_incident(), RULE, Evaluator())
    assert r.provenance == "llm" and good.response_formats == [None]
