"""``icml26 report``: tables generated from results, idempotent, and ``--check`` catching staleness."""

from __future__ import annotations

import json
import shutil

import pytest

from icml26 import runner
from icml26.report import ReportError, find_root, replace_block, typed_numbers, update
from icml26.runner import run_paper

from .conftest import ROOT
from .helpers import DEMO_CARD, demo_experiment, write_demo_card

PAPER_README = ("# Demo\n\n## Results\n\n<!-- icml26:results:begin -->\n<!-- icml26:results:end -->\n\n## Deviations\n"
                "\n## Card history\n\n<!-- icml26:history:begin -->\n<!-- icml26:history:end -->\n")


CLEAN_ENV = {"python": "3.11", "torch": "2.13.0", "git_sha": "0" * 40, "git_dirty": False, "git_dirty_files": []}


def _demo_project(tmp_path):
    """A project root with the real README and one implemented demo paper (card, README, source)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "icml26"\n')
    shutil.copy(ROOT / "README.md", root / "README.md")
    demo = write_demo_card(root)
    (demo.folder / "README.md").write_text(PAPER_README)
    (demo.folder / "experiment.py").write_text("GAP = 0.1\n")
    return root, demo


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A throw-away project root with the real README, one implemented demo paper, its source and results.

    The results are written as from a clean commit (whatever the state of this checkout).
    """
    monkeypatch.setattr(runner, "environment", lambda: dict(CLEAN_ENV))
    root, demo = _demo_project(tmp_path)
    for mode in ("quick", "full"):
        run_paper(demo, mode=mode, out_dir=root / "results", experiment=demo_experiment(), show_progress=False)
    return root, demo


def _edit(path, mutate):
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))


def _claim(data, cid):
    return next(c for c in data["claims"] if c["id"] == cid)


@pytest.mark.parametrize("forge, message", [
    (lambda d: _claim(d, "absolute").update(verdict="holds", holds=True), "does not follow"),
    (lambda d: _claim(d, "gain").update(interval=[0.2, 0.3]), "does not follow"),
    (lambda d: _claim(d, "gain").update(ours="method.acc = 0.99"), "does not follow"),
    (lambda d: d["arms"]["method"]["acc"].update(mean=0.99), "do not follow from its values"),
    (lambda d: d["arms"]["method"]["acc"]["values"].__setitem__(0, 0.99), "do not follow from its values"),
    (lambda d: d["arms"]["method"]["correct"]["unit_values"][0].__setitem__(0, 0.0), "not the means"),
    (lambda d: _claim(d, "gain").update(text="method crushes baseline"), "does not follow"),
    (lambda d: _claim(d, "gain").update(check="method.acc - baseline.acc >= 0.01 over seeds"), "older check"),
    (lambda d: d["env"].update(git_dirty=True, git_dirty_files=["src/icml26/demo/experiment.py"]),
     "dirty tree (uncommitted: src/icml26/demo/experiment.py)"),
    (lambda d: d.update(complete=False), "partial result"),
    (lambda d: d.update(seeds=[0, 1, 5]), "differ from the card"),
    (lambda d: _claim(d, "gain").update(direction="lower"), "does not follow"),
    (lambda d: _claim(d, "absolute").update(headline=True), "does not follow"),
    (lambda d: d["headline"].update(decidable=False), "headline entry"),
    (lambda d: d["overlap"]["items"]["train"].__setitem__(0, 4), "overlap training"),
    (lambda d: d["unit_ids"]["items"][0].__setitem__(1, "s0-0"), "does not follow"),
])
def test_check_fails_on_each_forgery(tree, forge, message):
    root, demo = tree
    assert update(root, papers=[demo]).problems == []
    assert update(root, papers=[demo], check=True).ok
    _edit(root / "results" / "demo" / "quick.json", forge)
    outcome = update(root, papers=[demo], check=True)
    assert any(message in p for p in outcome.problems), outcome.problems


def _git(root, *args):
    import subprocess

    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def git_tree(tmp_path, monkeypatch):
    """The demo tree as a git repository whose results name its commit (as from a clean checkout)."""
    root, demo = _demo_project(tmp_path)
    _git(root, "init", "-q")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "card")
    sha = _git(root, "rev-parse", "HEAD")
    monkeypatch.setattr(runner, "environment", lambda: {**CLEAN_ENV, "git_sha": sha})
    for mode in ("quick", "full"):
        run_paper(demo, mode=mode, out_dir=root / "results", experiment=demo_experiment(), show_progress=False)
    return root, demo, sha


@pytest.mark.parametrize("forge, message", [
    (lambda d: d["provenance"].update(card_sha256="0" * 64), "card_sha256 is not the hash of the card"),
    (lambda d: d["env"].update(git_sha="1" * 40), "is not a commit of this branch"),
    (lambda d: d["provenance"]["sources"].update({"demo/experiment.py": "f" * 64}), "source hashes"),
])
def test_check_verifies_provenance_against_git(git_tree, forge, message):
    root, demo, _ = git_tree
    assert update(root, papers=[demo]).problems == []
    _edit(root / "results" / "demo" / "full.json", forge)
    outcome = update(root, papers=[demo], check=True)
    assert any(message in p for p in outcome.problems), outcome.problems


def test_card_history_lists_changes_after_the_first_result(git_tree):
    root, _demo, _ = git_tree
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "results")
    looser = DEMO_CARD.replace('check = "method.acc - baseline.acc >= 0.05 over seeds"',
                               'check = "method.acc - baseline.acc >= 0.02 over seeds"').replace(
        'direction = "higher"\npaper = { value = "0.9"', 'direction = "lower"\npaper = { value = "0.9"')
    changed = write_demo_card(root, looser)
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "loosen the gain")
    outcome = update(root, papers=[changed])
    text = (changed.folder / "README.md").read_text()
    assert "| gain | threshold: `0.05` → `0.02` | looser | quick: holds → (no result since)" in text
    assert "| absolute | direction: `higher` → `lower` |  |" in text
    # the card changed after the results: the decision fields no longer match the commit they name
    assert any("'absolute' changed on the card" in p and "direction" in p for p in outcome.problems)


def test_card_history_lists_a_change_of_the_claims_a_precondition_gates(git_tree):
    """A precondition's ``gates`` is a decision field: scoping it after a result shows in the card history (it was
    computed but not compared until the COCA #51 item 3 revision, whose gates change the history left out)."""
    root, _demo, _ = git_tree
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "results")
    scoped = DEMO_CARD.replace('check = "method.acc >= 0.99 over seeds"',
                               'check = "method.acc >= 0.99 over seeds"\nkind = "precondition"\ngates = ["items"]')
    changed = write_demo_card(root, scoped)
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "scope the precondition")
    update(root, papers=[changed])
    text = (changed.folder / "README.md").read_text()
    assert "| absolute | kind: `evidence` → `precondition`; gates: `` → `items` |" in text


def test_card_history_lists_preset_changes_at_the_result_that_first_ran_them(git_tree):
    """A preset change (the config a committed result stores) is a row of the card history at the result commit
    that first ran it, naming each changed setting and the headline's verdict before and after; a rerun with the
    same preset adds no row."""
    from icml26.history import Git, card_history

    root, demo, _ = git_tree
    commit = ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm"]
    _git(root, "add", "-A")
    _git(root, *commit, "results")
    assert card_history(Git(root), "demo") == []
    run_paper(demo, mode="full", out_dir=root / "results", experiment=demo_experiment(gap=0.0), show_progress=False)
    _git(root, "add", "-A")
    _git(root, *commit, "full with no gap")
    sha = _git(root, "rev-parse", "HEAD")
    run_paper(demo, mode="quick", out_dir=root / "results", experiment=demo_experiment(), show_progress=False)
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "--allow-empty", "-qm", "quick again")
    rows = card_history(Git(root), "demo")
    assert [(c.sha, c.claim, c.new) for c in rows] == [(sha, "(preset, full)", "gap: `0.1` → `0.0`")]
    assert rows[0].verdicts == {"full": ("holds", "fails")}
    update(root, papers=[demo])
    assert "| (preset, full) | gap: `0.1` → `0.0` |  | full: holds → fails |" in (demo.folder / "README.md").read_text()


def test_config_must_be_the_preset(tree, monkeypatch):
    from icml26 import report

    root, demo = tree
    data = json.loads((root / "results" / "demo" / "quick.json").read_text())
    exp = demo_experiment()
    monkeypatch.setattr(runner, "load_experiment", lambda paper: exp)
    assert report.config_problems(demo, "quick", data, "q.json") == []
    data["config"]["gap"] = 0.3
    assert "config differs from the quick preset (gap: stored 0.3, preset 0.1)" in report.config_problems(
        demo, "quick", data, "q.json")[0]


def test_check_fails_when_the_source_changed_and_names_the_file(tree):
    root, demo = tree
    update(root, papers=[demo])
    (demo.folder / "experiment.py").write_text("GAP = 0.2\n")
    (demo.folder / "extra.py").write_text("")
    outcome = update(root, papers=[demo], check=True)
    msg = next(p for p in outcome.problems if "source files" in p)
    assert "changed: demo/experiment.py" in msg and "new: demo/extra.py" in msg
    assert "icml26 reproduce demo --mode quick" in msg


def test_check_fails_when_a_card_claim_changes(tree):
    root, demo = tree
    update(root, papers=[demo])
    changed = write_demo_card(root, DEMO_CARD.replace('text = "method beats baseline"',
                                                      'text = "method beats baseline by far"'))
    outcome = update(root, papers=[changed], check=True)
    assert any("'gain' does not follow" in p and "text" in p for p in outcome.problems)


def test_check_fails_when_full_disappears(tree):
    root, demo = tree
    update(root, papers=[demo])
    (root / "results" / "demo" / "full.json").unlink()
    outcome = update(root, papers=[demo], check=True)
    assert any("has no" in p and "full.json" in p for p in outcome.problems)


def test_typed_numbers_in_prose_are_caught(tree):
    root, demo = tree
    update(root, papers=[demo])
    data = json.loads((root / "results" / "demo" / "quick.json").read_text())
    value = data["arms"]["method"]["acc"]["mean"]
    readme = demo.folder / "README.md"
    readme.write_text(readme.read_text() + f"\nThe method reached {value:.3f} here; lr 0.001.\n")
    outcome = update(root, papers=[demo], check=True)
    assert any("typed into the prose" in p and f"{value:.3f}" in p for p in outcome.problems)
    assert typed_numbers("x 0.50 y", {0.5}, allowed=["0.50 (Table 1)"]) == []
    assert typed_numbers("```\n0.50\n```", {0.5}) == []


def test_report_writes_tables_then_is_idempotent(tree):
    root, demo = tree
    first = update(root, papers=[demo])
    assert first.problems == []
    assert set(first.changed) == {root / "README.md", demo.folder / "README.md"}
    readme = (root / "README.md").read_text()
    assert "[`demo`](src/icml26/demo/README.md) | method beats baseline | +5 points (Table 1; toy) |" in readme
    assert "| holds | holds (power " in readme  # full decides, quick beside it with its power
    paper = (demo.folder / "README.md").read_text()
    assert "### quick mode — seeds 0, 1, 2" in paper and "a toy cannot reach 0.99" in paper
    assert "runs (sanity)" in paper and "| **fails** |" in paper
    assert paper.endswith("<!-- icml26:history:end -->\n") and "**Power of the headline** (`gain`" in paper
    second = update(root, papers=[demo])
    assert second.ok
    assert update(root, papers=[demo], check=True).ok


def test_check_catches_a_stale_table_and_changes_nothing(tree):
    root, demo = tree
    update(root, papers=[demo])
    run_paper(demo, mode="quick", out_dir=root / "results", experiment=demo_experiment(gap=0.01),
              show_progress=False)
    before = (root / "README.md").read_text()
    outcome = update(root, papers=[demo], check=True)
    assert root / "README.md" in outcome.changed and demo.folder / "README.md" in outcome.changed
    assert not outcome.ok
    assert (root / "README.md").read_text() == before


def test_check_catches_missing_results_and_changed_cards(tree):
    root, demo = tree
    update(root, papers=[demo])
    (root / "results" / "demo" / "quick.json").unlink()
    outcome = update(root, papers=[demo], check=True)
    assert any("has no" in p and "quick.json" in p for p in outcome.problems)

    run_paper(demo, mode="quick", out_dir=root / "results", experiment=demo_experiment(), show_progress=False)
    changed = write_demo_card(root, DEMO_CARD.replace(">= 0.05 over seeds", ">= 0.2 over seeds"))
    outcome = update(root, papers=[changed], check=True)
    assert any("older check" in p for p in outcome.problems)


def test_missing_markers_are_a_problem(tree):
    root, demo = tree
    (demo.folder / "README.md").write_text("# Demo without markers\n")
    outcome = update(root, papers=[demo])
    assert any("markers" in p for p in outcome.problems)


def test_replace_block_and_find_root(tmp_path):
    text = "a\n<!-- icml26:x:begin -->\nold\n<!-- icml26:x:end -->\nb\n"
    assert replace_block(text, "x", "new") == "a\n<!-- icml26:x:begin -->\nnew\n<!-- icml26:x:end -->\nb\n"
    with pytest.raises(ReportError):
        replace_block("no markers", "x", "new")
    assert find_root(ROOT / "src" / "icml26") == ROOT
    with pytest.raises(ReportError):
        find_root(tmp_path)


def test_the_repository_tables_are_fresh():
    outcome = update(ROOT, check=True)
    assert outcome.ok, f"run `icml26 report`: stale {outcome.changed}, problems {outcome.problems}"


def test_check_fails_on_a_benchmark_from_a_dirty_tree(tree):
    from icml26.common.bench import bench_row, write_bench

    root, demo = tree
    readme = demo.folder / "README.md"
    readme.write_text(readme.read_text() + "\n<!-- icml26:bench:begin -->\n<!-- icml26:bench:end -->\n")
    path = write_bench("demo", [bench_row("step", "peer step", 2.0, 1.0)], conditions="toy",
                       out_dir=root / "results")
    _edit(path, lambda d: d["env"].update(git_dirty=False))
    assert update(root, papers=[demo]).problems == []
    _edit(path, lambda d: d["env"].update(git_dirty=True, git_dirty_files=["benchmarks/demo.py"]))
    outcome = update(root, papers=[demo], check=True)
    assert any("dirty tree (uncommitted: benchmarks/demo.py)" in p and "benchmarks/demo.py from a clean" in p
               for p in outcome.problems), outcome.problems


def test_median_ms_calls_each_round_and_refuses_no_rounds():
    from icml26.common.bench import median_ms

    calls = []
    assert median_ms(lambda: calls.append(1), 5) >= 0.0
    assert len(calls) == 5
    with pytest.raises(ValueError, match="rounds"):
        median_ms(lambda: None, 0)


def test_power_takes_the_seed_spread_from_full_when_quick_has_one_run():
    from types import SimpleNamespace

    from icml26.common.claims import parse_check
    from icml26.report import power_statement

    check = parse_check("m.x - b.x >= 0.05 over items")
    headline = SimpleNamespace(id="gain", check=check, power_why="")
    paper = SimpleNamespace(headline=headline, modes={"full": SimpleNamespace(seeds=[10, 11, 12])})

    def result(shifts):
        units = [[0.1 + s + 0.01 * (i % 5) for i in range(40)] for s in shifts]
        arms = {"m": {"x": {"values": [sum(u) / 40 for u in units], "unit_values": units, "unit": "items"}},
                "b": {"x": {"values": [0.0] * len(shifts), "unit_values": [[0.0] * 40 for _ in shifts],
                            "unit": "items"}}}
        return {"arms": arms, "claims": [{"id": "gain", "estimate": 0.1}]}

    quick, full = result([0.0]), result([0.0, 0.2, -0.15])
    alone = power_statement(paper, quick, None)
    both = power_statement(paper, quick, full)
    assert alone["seed_spread_from"] is None and both["seed_spread_from"] == "full"
    # the full runs' spread (0.18 sd between run means) dominates the units' own noise
    assert both["full_detectable"] > 5 * alone["full_detectable"]
    assert power_statement(paper, full, None)["seed_spread_from"] == "quick"


def test_a_result_of_older_rules_is_marked_only_where_the_current_rules_decide_differently():
    from icml26.common.claims import RULES
    from icml26.report import current_rules_agree, rules_note

    data = json.loads((ROOT / "results" / "branch_and_cut" / "quick.json").read_text())
    assert rules_note({**data, "rules": RULES}) == ""
    old = {**data, "rules": RULES - 1}
    assert current_rules_agree(old) and rules_note(old) == f"verdicts v{RULES - 1}; v{RULES} decides the same"
    claims = [dict(c) for c in data["claims"]]
    claims[0]["verdict"] = next(v for v in ("holds", "fails") if v != claims[0]["verdict"])
    moved = {**old, "claims": claims}
    assert not current_rules_agree(moved)
    assert rules_note(moved) == f"verdicts v{RULES - 1}, to be regenerated: v{RULES} decides differently"
    claims[0] = {**data["claims"][0], "interval": [x + 0.5 for x in data["claims"][0]["interval"]]}
    assert not current_rules_agree({**old, "claims": claims})


def test_card_history_sees_a_retrained_declaration():
    """Declaring a check's runs retrained can move its verdict: the history lists it as a change of units."""
    from icml26.history import _decision

    plain = _decision({"check": "sft.asr >= 0.8 over prompts"})
    kept = _decision({"check": "sft.asr >= 0.8 over prompts in retrained runs"})
    assert plain["units"] == "prompts" and kept["units"] == "prompts in retrained runs"
    assert {k for k in plain if plain[k] != kept[k]} == {"units"}


def test_an_arms_block_leads_with_the_named_arms_of_full(tree):
    """A paper README's ``arms_PREFIX`` block gets the arms named PREFIX (or PREFIX_*) of the full result, is kept
    fresh by --check, and a prefix naming no arm is a problem."""
    root, demo = tree
    readme = demo.folder / "README.md"
    readme.write_text(readme.read_text().replace("## Results", "<!-- icml26:arms_method:begin -->\n"
                                                 "<!-- icml26:arms_method:end -->\n\n## Results"))
    assert update(root, papers=[demo]).problems == []
    text = readme.read_text()
    block = text[text.index("arms_method:begin"):text.index("arms_method:end")]
    assert "_full mode, seeds " in block and "| metric | method |" in block and "baseline" not in block
    assert update(root, papers=[demo], check=True).ok
    readme.write_text(text.replace("| metric | method |", "| metric | methods |"))
    assert not update(root, papers=[demo], check=True).ok                     # a stale block is caught
    readme.write_text(text.replace("arms_method", "arms_nothing"))
    out = update(root, papers=[demo], check=True)
    assert any("arms_nothing names no arm" in p for p in out.problems)
