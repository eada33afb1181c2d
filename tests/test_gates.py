"""Scoped preconditions (``gates``): a precondition that establishes the premise of named claims only.

A precondition without ``gates`` gates the headline (as before); one with ``gates`` leaves the named evidence
claims *not decidable* where it does not hold, and the headline alone.
"""

from __future__ import annotations

import json

import pytest

from icml26 import runner
from icml26.registry import CardError
from icml26.report import tally, update
from icml26.runner import gated_entries, headline_entry, run_paper

from .helpers import DEMO_CARD, demo_experiment, write_demo_card
from .test_report import CLEAN_ENV, _demo_project

ROOM = """
[[claims]]
id = "room"
kind = "precondition"
gates = ["items"]
text = "the world leaves room for the per-item gain"
metric = "acc"
direction = "higher"
paper = { value = "-", where = "-", scale = "-" }
check = "CHECK"
min_effect_why = "the premise of items"
"""
FAILS = "method.acc >= 0.99 over seeds"  # the demo's method scores 0.6-0.9: this precondition fails
HOLDS = "baseline.acc >= 0.3 over seeds"  # the demo's baseline scores 0.5-0.8: this one holds


def _card(check: str = FAILS, gates: str = '["items"]') -> str:
    return DEMO_CARD + ROOM.replace("CHECK", check).replace('["items"]', gates)


def test_a_card_parses_gates_and_refuses_bad_ones(tmp_path):
    paper = write_demo_card(tmp_path, _card())
    room = next(c for c in paper.claims if c.id == "room")
    assert room.gates == ("items",) and room.gated("items", "gain") and not room.gated("gain", "gain")
    plain = next(c for c in paper.claims if c.id == "items")
    assert plain.gates == () and not plain.gated("items", "gain")
    for gates, msg in (('["nothing"]', "not an evidence claim"), ('["runs"]', "not an evidence claim"),
                       ('["room"]', "not an evidence claim"), ('"items"', "must be a list of strings")):
        with pytest.raises(CardError, match=msg):
            write_demo_card(tmp_path, _card(gates=gates))
    on_evidence = DEMO_CARD.replace('id = "items"\n', 'id = "items"\ngates = ["gain"]\n')
    with pytest.raises(CardError, match="gates belongs to a precondition"):
        write_demo_card(tmp_path, on_evidence)


@pytest.mark.parametrize("check, decidable", [(FAILS, False), (HOLDS, True)])
def test_a_scoped_precondition_gates_its_claims_and_not_the_headline(tmp_path, check, decidable):
    paper = write_demo_card(tmp_path / "tree", _card(check))
    result = run_paper(paper, mode="quick", out_dir=tmp_path / "res", experiment=demo_experiment(0.1),
                       show_progress=False)
    verdicts = {c["id"]: c["verdict"] for c in result["claims"]}
    assert verdicts["room"] == ("fails" if not decidable else "holds")
    assert result["gated"] == {"items": {"preconditions": {"room": verdicts["room"]}, "decidable": decidable}}
    # the headline is not gated by a precondition that names other claims
    assert result["headline"] == {"id": "gain", "verdict": verdicts["gain"], "preconditions": {},
                                  "decidable": True}
    counted = sum(int(n) for n in tally(result).split(" / "))
    assert counted == 3 - (not decidable)  # gain, absolute and items are evidence; items drops out when gated


def test_an_unscoped_precondition_still_gates_the_headline_only(tmp_path):
    paper = write_demo_card(tmp_path, _card(FAILS, gates="[]"))
    claims = [{"id": "gain", "verdict": "holds"}, {"id": "items", "verdict": "holds"},
              {"id": "room", "verdict": "fails", "kind": "precondition"}]
    assert headline_entry(paper, [{**c, "kind": c.get("kind", "evidence")} for c in claims]) == {
        "id": "gain", "verdict": "holds", "preconditions": {"room": "fails"}, "decidable": False}
    assert gated_entries(paper, claims) == {}


def test_a_gate_not_run_in_the_mode_leaves_its_claims_not_decidable(tmp_path):
    paper = write_demo_card(tmp_path, _card().replace('min_effect_why = "the premise of items"',
                                                      'min_effect_why = "the premise of items"\nmodes = ["full"]'))
    claims = [{"id": "gain", "verdict": "holds"}, {"id": "items", "verdict": "holds"}]
    assert gated_entries(paper, claims) == {"items": {"preconditions": {"room": "not run"}, "decidable": False}}


def test_report_shows_and_checks_the_gate(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "environment", lambda: dict(CLEAN_ENV))
    root, _ = _demo_project(tmp_path)
    paper = write_demo_card(root, _card())
    for mode in ("quick", "full"):
        run_paper(paper, mode=mode, out_dir=root / "results", experiment=demo_experiment(), show_progress=False)
    assert update(root, papers=[paper]).problems == []
    text = (paper.folder / "README.md").read_text()
    assert "not decidable in this world (room fails); measured:" in text and "room (precondition; gates items)" in text
    assert update(root, papers=[paper], check=True).ok
    path = root / "results" / "demo" / "quick.json"
    data = json.loads(path.read_text())
    data["gated"]["items"]["decidable"] = True
    path.write_text(json.dumps(data))
    problems = update(root, papers=[paper], check=True).problems
    assert any("gated claims" in p for p in problems), problems


def test_a_precondition_may_name_the_headline_among_its_claims(tmp_path):
    paper = write_demo_card(tmp_path, _card(FAILS, gates='["gain", "items"]'))
    claims = [{"id": "gain", "verdict": "holds", "kind": "evidence"},
              {"id": "items", "verdict": "holds", "kind": "evidence"},
              {"id": "room", "verdict": "fails", "kind": "precondition"}]
    assert headline_entry(paper, claims)["decidable"] is False
    assert set(gated_entries(paper, claims)) == {"items"}  # the headline's gate lives in its headline entry
