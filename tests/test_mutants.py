"""The mutation check (issue #46): every paper's mutants file is current, and its fast tests kill every mutant.

The fast tests here check the files (keys, names, at least five mutants, each ``find`` text present exactly once
in today's source) and the harness on a tiny project; the slow tier runs every mutant of every paper.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _harness():
    spec = importlib.util.spec_from_file_location("icml26_mutants", ROOT / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


mutants = _harness()
PAPERS = sorted(p.parent.name for p in (ROOT / "src" / "icml26").glob("*/paper.toml"))


def _implemented(slug: str) -> bool:
    import tomllib

    with (ROOT / "src" / "icml26" / slug / "paper.toml").open("rb") as fh:
        return tomllib.load(fh).get("status") == "implemented"


@pytest.mark.parametrize("slug", [s for s in PAPERS if _implemented(s)])
def test_every_paper_lists_at_least_five_current_mutants(slug):
    listed = mutants.load(slug, ROOT)
    assert len(listed) >= mutants.MIN_MUTANTS, f"{slug}: {len(listed)} mutants"
    for m in listed:
        text = (ROOT / m.file).read_text(encoding="utf-8")
        assert text.count(m.find) == 1, f"{slug}:{m.name}: find text occurs {text.count(m.find)} times in {m.file}"


def _project(tmp_path: Path) -> Path:
    (tmp_path / "src" / "icml26" / "toy").mkdir(parents=True)
    (tmp_path / "src" / "icml26" / "__init__.py").write_text("")
    (tmp_path / "src" / "icml26" / "toy" / "__init__.py").write_text("")
    (tmp_path / "src" / "icml26" / "toy" / "core.py").write_text(
        "def mean(x):\n    return sum(x) / len(x)\n\n\ndef unused(x):\n    return 2 * x\n")
    (tmp_path / "tests" / "toy").mkdir(parents=True)
    (tmp_path / "tests" / "toy" / "test_core.py").write_text(
        "from icml26.toy.core import mean\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n")
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\nmarkers = ['slow: slow']\n")
    (tmp_path / "tests" / "toy" / "mutants.toml").write_text('''
[[mutant]]
name = "off_by_one"
file = "src/icml26/toy/core.py"
find = "/ len(x)"
replace = "/ (len(x) - 1)"
why = "the mean is biased"

[[mutant]]
name = "dead_code"
file = "src/icml26/toy/core.py"
find = "2 * x"
replace = "3 * x"
why = "nothing calls it: survives"

[[mutant]]
name = "gone"
file = "src/icml26/toy/core.py"
find = "no such text"
replace = "x"
why = "stale"
''')
    return tmp_path


def test_harness_kills_a_tested_bug_and_reports_a_survivor_and_a_stale_mutant(tmp_path):
    root = _project(tmp_path)
    before = (root / "src" / "icml26" / "toy" / "core.py").read_text()
    outcomes = {o.mutant.name: o.status for o in mutants.check(["toy"], only={"off_by_one", "dead_code", "gone"},
                                                               root=root, echo=False)}
    assert outcomes == {"off_by_one": "killed", "dead_code": "survived", "gone": "stale"}
    assert (root / "src" / "icml26" / "toy" / "core.py").read_text() == before  # edits only in the copy
    with pytest.raises(ValueError, match="at least 5"):
        mutants.check(["toy"], root=root, echo=False)


def test_bad_mutants_files_are_refused(tmp_path):
    root = _project(tmp_path)
    path = root / "tests" / "toy" / "mutants.toml"
    path.write_text('[[mutant]]\nname = "a"\nfile = "src/icml26/toy/core.py"\nfind = "x"\nreplace = "x"\nwhy = "w"\n')
    with pytest.raises(ValueError, match="changes nothing"):
        mutants.load("toy", root)
    path.write_text('[[mutant]]\nname = "a"\nfile = "src/icml26/toy/core.py"\nfind = "x"\nreplace = "y"\n')
    with pytest.raises(ValueError, match="lacks why"):
        mutants.load("toy", root)
    path.write_text('[[mutant]]\nname = "a"\nfile = "../etc/passwd"\nfind = "x"\nreplace = "y"\nwhy = "w"\n')
    with pytest.raises(ValueError, match="under src/icml26"):
        mutants.load("toy", root)


@pytest.mark.slow
@pytest.mark.parametrize("slug", [s for s in PAPERS if _implemented(s)])
def test_fast_tests_kill_every_mutant(slug):
    outcomes = mutants.check([slug], echo=False)
    bad = [f"{o.status} {o.mutant.name}: {o.detail}" for o in outcomes if o.status in ("survived", "stale")]
    assert not bad, f"{slug}: " + "; ".join(bad)
