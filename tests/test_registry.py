"""Every card is valid, and every paper marked implemented has what 'implemented' means."""

from __future__ import annotations

import re

import pytest

from icml26.registry import CardError, UnknownPaperError, get_paper, list_papers, load_card
from icml26.runner import check_experiment_module, load_experiment

from .conftest import ROOT
from .helpers import DEMO_CARD, write_demo_card

SLUGS = [
    "air", "fedit", "audio_watermark", "moda", "shampoo", "branch_and_cut", "gcpa", "xfedalign", "regret_po",
    "align_ti", "sarl", "float_networks", "inverse_optimization", "coca", "fedtreelora", "spard", "ps_ppo",
    "vq_rank", "unsafe_moe",
]
PAPERS = list_papers()
IMPLEMENTED = [p for p in PAPERS if p.implemented]


def test_nineteen_cards_in_order():
    assert [p.slug for p in PAPERS] == SLUGS
    assert [p.number for p in PAPERS] == list(range(1, 20))


def test_slugs_match_the_shared_paper_list():
    index = ROOT.parent / "shared" / "papers" / "README.md"
    if not index.is_file():
        pytest.skip("../shared/papers is not present in this checkout")
    listed = re.findall(r"^\| \d\d \| `([a-z_]+)` \|", index.read_text(), flags=re.M)
    assert listed == SLUGS


@pytest.mark.parametrize("paper", PAPERS, ids=lambda p: p.slug)
def test_card_is_complete(paper):
    assert paper.claims and paper.headline in paper.claims
    for claim in paper.claims:
        assert claim.text and claim.paper.value and claim.paper.where and claim.paper.scale
        assert set(claim.modes) <= {"smoke", "quick", "full"}
    card = (paper.folder / "paper.toml").read_text()
    for mode, limit in (("quick", 120), ("full", 900)):
        if paper.modes[mode].budget_s > limit:  # a longer budget is stated on the card with its reason
            table = re.search(rf"^\[modes\.{mode}\]\n(.*?)^budget_s", card, flags=re.M | re.S)
            assert table and re.search(r"^#.*budget is \d+ s.*\n(#.*\n)+", table.group(1), flags=re.M), (
                f"{mode} reproductions must fit in {limit} s, or the card must say why it needs longer")
    init = (paper.folder / "__init__.py").read_text()
    assert init.startswith('"""'), "the paper's __init__ needs its docstring"
    if not paper.implemented:
        assert "not implemented yet" in init


@pytest.mark.parametrize("paper", IMPLEMENTED or [pytest.param(None, marks=pytest.mark.skip("none yet"))],
                         ids=lambda p: getattr(p, "slug", "none"))
def test_implemented_paper_has_everything(paper):
    component = paper.resolve_component()
    assert component is not None
    check_experiment_module(load_experiment(paper), paper.slug)
    readme = paper.folder / "README.md"
    assert readme.is_file(), f"{paper.slug}: README.md missing"
    text = readme.read_text()
    for needed in ("<!-- icml26:results:begin -->", "<!-- icml26:results:end -->", "Deviations"):
        assert needed in text, f"{paper.slug}: README lacks {needed!r}"
    tests = list((ROOT / "tests" / paper.slug).glob("test_*.py"))
    assert tests, f"{paper.slug} is marked implemented but tests/{paper.slug}/ has no test module"
    smoke = [t for t in tests if "--mode" in t.read_text() or "reproduce_in_subprocess" in t.read_text()]
    assert smoke, f"{paper.slug}: no smoke run of the experiment in tests/{paper.slug}/"


def test_unknown_slug_suggests_close_matches():
    with pytest.raises(UnknownPaperError) as err:
        get_paper("shampo")
    assert err.value.suggestions == ["shampoo"]
    assert "did you mean shampoo" in str(err.value)
    with pytest.raises(UnknownPaperError) as err:
        get_paper("nosuchpaper")
    assert err.value.suggestions == []
    with pytest.raises(TypeError):
        get_paper(5)  # type: ignore[arg-type]


def test_list_patterns():
    assert [p.slug for p in list_papers("fed*")] == ["fedit", "fedtreelora"]
    assert {p.slug for p in list_papers("fed")} == {"fedit", "xfedalign", "fedtreelora"}
    assert [p.slug for p in list_papers("05")] == ["shampoo"]
    assert list_papers("zzz") == []


@pytest.mark.parametrize("old, new, msg", [
    ('kind = "estimator"', 'kind = "widget"', "kind 'widget' is not one of"),
    ('status = "implemented"', 'status = "done"', "status 'done'"),
    ('check = "method.acc >= 0.99 over seeds"', 'check = "method.acc is big"', "does not parse"),
    ('check = "method.acc >= 0.99 over seeds"', 'check = "method.acc >= 0.99 on mean"', "does not parse"),
    ('min_effect_why = "the paper\'s accuracy"\n', "", "needs min_effect_why"),
    ('check = "method.acc - baseline.acc >= 0.05 over seeds"', 'check = "method.acc - baseline.acc > 0 over seeds"',
     "needs a minimum effect"),
    ('check = "method.acc - baseline.acc >= 0.05 over seeds"', 'check = "method.acc / baseline.acc >= 1 over seeds"',
     "needs a minimum effect"),
    ('kind = "sanity"', 'kind = "proof"', "kind must be one of"),
    ('id = "gain"\nheadline = true', 'id = "gain"', None),
    ('id = "absolute"', 'id = "gain"', "duplicate claim id"),
    ('title = "A demo paper"\n', "", "missing field 'title'"),
    ('direction = "higher"\npaper = { value = "0.9"', 'direction = "up"\npaper = { value = "0.9"', "direction"),
    ("budget_s = 60", "budget_s = -1", "budget_s must be positive"),
    ('extras = []', 'extras = ["gpu"]', "unknown values ['gpu']"),
    ('component = "icml26.demo:Thing"', 'component = "os:system"', "must live under icml26.demo"),
    ('modes = ["quick", "full"]', 'modes = ["fast"]', "unknown values ['fast']"),
])
def test_bad_cards_name_file_and_field(tmp_path, old, new, msg):
    assert old in DEMO_CARD
    if msg is None:  # a valid variation
        write_demo_card(tmp_path, DEMO_CARD.replace(old, new, 1))
        return
    with pytest.raises(CardError, match=re.escape(msg)) as err:
        write_demo_card(tmp_path, DEMO_CARD.replace(old, new, 1))
    assert "paper.toml" in str(err.value)


def test_sanity_claims_and_headline(tmp_path):
    demo = write_demo_card(tmp_path)
    kinds = {c.id: c.kind for c in demo.claims}
    assert kinds == {"gain": "evidence", "absolute": "evidence", "items": "evidence", "runs": "sanity"}
    assert demo.headline.id == "gain"
    # a sanity check may use a zero threshold and needs no reason; it can never be the headline
    with pytest.raises(CardError, match="headline claim must be evidence"):
        write_demo_card(tmp_path, DEMO_CARD.replace('id = "gain"\nheadline = true', 'id = "gain"').replace(
            'id = "runs"\n', 'id = "runs"\nheadline = true\n'))
    no_headline = write_demo_card(tmp_path, DEMO_CARD.replace('id = "gain"\nheadline = true', 'id = "gain"'))
    assert no_headline.headline.id == "gain"


def test_slug_must_match_folder(tmp_path):
    card = write_demo_card(tmp_path)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "paper.toml").write_text(card.path.read_text())
    with pytest.raises(CardError, match="must equal the folder name"):
        load_card(other / "paper.toml")
