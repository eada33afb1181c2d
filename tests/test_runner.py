"""``icml26 reproduce`` machinery on a demo card and experiment: schema, computed claims, determinism."""

from __future__ import annotations

import dataclasses
import types

import pytest

from icml26 import registry
from icml26.common.claims import RULES
from icml26.common.results import SeedRun, read_result
from icml26.runner import MissingExtrasError, NotImplementedPaperError, ReproduceError, run_paper

from .helpers import demo_experiment, write_demo_card


@pytest.fixture
def demo(tmp_path):
    return write_demo_card(tmp_path / "tree")


def test_writes_a_valid_result_with_computed_claims(demo, tmp_path):
    calls: list = []
    result = run_paper(demo, mode="quick", out_dir=tmp_path / "res", experiment=demo_experiment(0.1, plot_calls=calls),
                       show_progress=False)
    on_disk = read_result(tmp_path / "res" / "demo" / "quick.json")
    assert on_disk["arms"] == result["arms"]
    assert result["seeds"] == [0, 1, 2] and result["config"] == {"gap": 0.1}
    claims = {c["id"]: c for c in result["claims"]}
    assert claims["gain"]["verdict"] == "holds" and claims["absolute"]["verdict"] == "fails"
    assert claims["gain"]["holds"] is True and claims["absolute"]["holds"] is False
    assert claims["absolute"]["notes"] == ["a toy cannot reach 0.99"]
    assert claims["runs"]["kind"] == "sanity" and claims["gain"]["kind"] == "evidence"
    assert claims["items"]["units"] == "240 distinct items in 3 run(s) (80 per seed x 3 seed(s)), paired"
    assert claims["items"]["design"]["clusters"] == 3 and claims["items"]["direction"] == "higher"
    assert result["rules"] == RULES and result["overlap"] == {"items": {"train": [0, 0, 0], "validation": [0, 0, 0]}}
    assert result["unit_ids"]["items"][1][:2] == ["s1-0", "s1-1"]
    assert result["headline"] == {"id": "gain", "verdict": "holds", "preconditions": {}, "decidable": True}
    assert result["arms"]["method"]["correct"]["unit"] == "items"
    assert result["complete"] is True and set(result["provenance"]) == {"card_sha256", "sources"}
    assert claims["gain"]["paper"] == {"value": "+5 points", "where": "Table 1", "scale": "toy"}
    assert result["env"]["python"] and "numpy" in result["env"]["packages"]
    assert calls == [(3, "quick", tmp_path / "res" / "demo")]


def test_refuses_test_units_that_were_trained_on(demo, tmp_path):
    with pytest.raises(ReproduceError, match=r"test units are also training.*items/train.*\[3, 3, 3\]"):
        run_paper(demo, mode="quick", out_dir=tmp_path, experiment=demo_experiment(0.1, leak=3), show_progress=False)
    assert not (tmp_path / "demo" / "quick.json").exists()


def test_claim_fails_when_the_gap_is_too_small(demo, tmp_path):
    result = run_paper(demo, mode="quick", out_dir=tmp_path, experiment=demo_experiment(0.01), show_progress=False)
    gain = next(c for c in result["claims"] if c["id"] == "gain")
    assert gain["verdict"] == "fails" and "upper bound" not in gain["why"] and "lower bound" in gain["why"]


def test_modes_restrict_claims(demo, tmp_path):
    result = run_paper(demo, mode="smoke", out_dir=tmp_path, experiment=demo_experiment(), show_progress=False)
    assert [c["id"] for c in result["claims"]] == ["gain", "items", "runs"]  # "absolute" is quick/full only


def test_same_seed_same_numbers(demo, tmp_path):
    a = run_paper(demo, mode="quick", seeds=[4, 2], out_dir=tmp_path / "a", experiment=demo_experiment(),
                  show_progress=False)
    b = run_paper(demo, mode="quick", seeds=[4, 2], out_dir=tmp_path / "b", experiment=demo_experiment(),
                  show_progress=False)
    assert a["arms"] == b["arms"] and a["seeds"] == [4, 2]


def test_contract_violations(demo, tmp_path):
    exp = demo_experiment()
    exp.run = lambda cfg: SeedRun({"method": {"acc": 1.0}})  # baseline missing
    with pytest.raises(ReproduceError, match="arm 'baseline' was not measured"):
        run_paper(demo, mode="quick", out_dir=tmp_path, experiment=exp, show_progress=False)
    exp.run = lambda cfg: {"method": {"acc": 1.0}}
    with pytest.raises(ReproduceError, match="must return a SeedRun"):
        run_paper(demo, mode="quick", out_dir=tmp_path, experiment=exp, show_progress=False)
    bad = types.ModuleType("bad")
    with pytest.raises(ReproduceError, match="Config must be a dataclass"):
        run_paper(demo, mode="quick", out_dir=tmp_path, experiment=bad, show_progress=False)
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("kwargs, err", [
    ({"mode": "fast"}, "mode must be one of"),
    ({"seeds": []}, "non-empty"),
    ({"seeds": [1, 1]}, "distinct"),
    ({"seeds": [-1]}, "non-negative"),
])
def test_bad_arguments(demo, tmp_path, kwargs, err):
    with pytest.raises(ValueError, match=err):
        run_paper(demo, out_dir=tmp_path, experiment=demo_experiment(), show_progress=False, **kwargs)


def test_planned_paper_is_refused(demo, tmp_path):
    planned = dataclasses.replace(demo, status="planned")
    with pytest.raises(NotImplementedPaperError, match="not implemented yet"):
        run_paper(planned, out_dir=tmp_path)


def test_missing_extra_names_the_pip_command(demo, tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "extra_requirements", lambda extra: ["surely-not-installed-dist"])
    needs_fl = dataclasses.replace(demo, extras=("fl",))
    with pytest.raises(MissingExtrasError, match=r'pip install "icml26\[fl\]"'):
        run_paper(needs_fl, out_dir=tmp_path, experiment=demo_experiment())
