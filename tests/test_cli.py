"""The ``icml26`` command, in-process."""

from __future__ import annotations

import dataclasses

import pytest

from icml26 import cli
from icml26.cli import main
from icml26.registry import get_paper, list_papers

PLANNED = [p for p in list_papers() if not p.implemented]


def test_list_prints_nineteen_rows(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:4] == ["#", "slug", "kind", "status"]
    assert len(lines) == 20
    assert lines[5].split()[:2] == ["05", "shampoo"]


def test_list_pattern(capsys):
    assert main(["list", "fed*"]) == 0
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]] == ["fedit", "fedtreelora"]
    assert main(["list", "zzz"]) == 1


def test_info(capsys):
    assert main(["info", "shampoo"]) == 0
    out = capsys.readouterr().out
    assert "05 shampoo" in out and "check: rate_shampoo_two_sided.slope" in out and "quick: seeds [0, 1, 2]" in out


def test_unknown_slug_exits_2_with_close_matches(capsys):
    assert main(["reproduce", "nosuchpaper"]) == 2
    assert "unknown paper 'nosuchpaper'" in capsys.readouterr().err
    assert main(["reproduce", "shampo"]) == 2
    assert "did you mean shampoo" in capsys.readouterr().err
    assert main(["info", "gpca"]) == 2
    assert "did you mean gcpa" in capsys.readouterr().err


@pytest.mark.skipif(not PLANNED, reason="every paper is implemented")
def test_planned_paper_says_not_implemented(capsys, tmp_path):
    assert main(["reproduce", PLANNED[0].slug, "--out", str(tmp_path)]) == 2
    assert "not implemented yet" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_missing_extra_names_pip_command(capsys, monkeypatch, tmp_path):
    paper = dataclasses.replace(get_paper("fedit"), status="implemented")
    monkeypatch.setattr(cli, "get_paper", lambda slug: paper)
    monkeypatch.setattr(cli, "missing_extras", lambda p, which="extras": {"fl": ["flwr"]})
    assert main(["reproduce", "fedit", "--out", str(tmp_path)]) == 2
    assert 'pip install "icml26[fl]"' in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["reproduce", "--seeds", "a,b"], ["reproduce", "--seeds", "1,1"],
                                  ["reproduce", "--mode", "huge"], ["frobnicate"], []])
def test_bad_usage_exits_2(argv, capsys):
    assert main(argv) == 2


def test_report_check_on_the_repository(capsys):
    assert main(["report", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("icml26 ")
