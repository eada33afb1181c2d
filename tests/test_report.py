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

PAPER_README = "# Demo\n\n## Results\n\n<!-- icml26:results:begin -->\n<!-- icml26:results:end -->\n\n## Deviations\n"


CLEAN_ENV = {"python": "3.11", "torch": "2.13.0", "git_sha": "0" * 40, "git_dirty": False, "git_dirty_files": []}


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A throw-away project root with the real README, one implemented demo paper, its source and results.

    The results are written as from a clean commit (whatever the state of this checkout).
    """
    monkeypatch.setattr(runner, "environment", lambda: dict(CLEAN_ENV))
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "icml26"\n')
    shutil.copy(ROOT / "README.md", root / "README.md")
    demo = write_demo_card(root)
    (demo.folder / "README.md").write_text(PAPER_README)
    (demo.folder / "experiment.py").write_text("GAP = 0.1\n")
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
])
def test_check_fails_on_each_forgery(tree, forge, message):
    root, demo = tree
    assert update(root, papers=[demo]).problems == []
    assert update(root, papers=[demo], check=True).ok
    _edit(root / "results" / "demo" / "quick.json", forge)
    outcome = update(root, papers=[demo], check=True)
    assert any(message in p for p in outcome.problems), outcome.problems


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
    assert "| holds | holds |" in readme
    paper = (demo.folder / "README.md").read_text()
    assert "### quick mode — seeds 0, 1, 2" in paper and "a toy cannot reach 0.99" in paper
    assert "runs (sanity)" in paper and "| **fails** |" in paper
    assert paper.endswith("## Deviations\n")
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
