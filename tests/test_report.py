"""``icml26 report``: tables generated from results, idempotent, and ``--check`` catching staleness."""

from __future__ import annotations

import shutil

import pytest

from icml26.report import ReportError, find_root, replace_block, update
from icml26.runner import run_paper

from .conftest import ROOT
from .helpers import DEMO_CARD, demo_experiment, write_demo_card

PAPER_README = "# Demo\n\n## Results\n\n<!-- icml26:results:begin -->\n<!-- icml26:results:end -->\n\n## Deviations\n"


@pytest.fixture
def tree(tmp_path):
    """A throw-away project root with the real README, one implemented demo paper and its quick result."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "icml26"\n')
    shutil.copy(ROOT / "README.md", root / "README.md")
    demo = write_demo_card(root)
    (demo.folder / "README.md").write_text(PAPER_README)
    run_paper(demo, mode="quick", out_dir=root / "results", experiment=demo_experiment(), show_progress=False)
    return root, demo


def test_report_writes_tables_then_is_idempotent(tree):
    root, demo = tree
    first = update(root, papers=[demo])
    assert first.problems == []
    assert set(first.changed) == {root / "README.md", demo.folder / "README.md"}
    readme = (root / "README.md").read_text()
    assert "[`demo`](src/icml26/demo/README.md) | method beats baseline |" in readme
    assert "| +5 points (Table 1; toy) | yes |" in readme
    paper = (demo.folder / "README.md").read_text()
    assert "### quick mode — seeds 0, 1, 2" in paper and "a toy cannot reach 0.99" in paper
    assert paper.endswith("## Deviations\n")
    second = update(root, papers=[demo])
    assert second.ok
    assert update(root, papers=[demo], check=True).ok


def test_check_catches_a_stale_table_and_changes_nothing(tree):
    root, demo = tree
    update(root, papers=[demo])
    run_paper(demo, mode="quick", seeds=[5, 6, 7], out_dir=root / "results", experiment=demo_experiment(),
              show_progress=False)
    before = (root / "README.md").read_text()
    outcome = update(root, papers=[demo], check=True)
    assert root / "README.md" in outcome.changed and not outcome.ok
    assert (root / "README.md").read_text() == before


def test_check_catches_missing_results_and_changed_cards(tree):
    root, demo = tree
    update(root, papers=[demo])
    (root / "results" / "demo" / "quick.json").unlink()
    outcome = update(root, papers=[demo], check=True)
    assert any("has no valid" in p for p in outcome.problems)

    run_paper(demo, mode="quick", out_dir=root / "results", experiment=demo_experiment(), show_progress=False)
    changed = write_demo_card(root, DEMO_CARD.replace(">= 0.05 on >= 2 of 3 seeds", ">= 0.2 on >= 2 of 3 seeds"))
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
