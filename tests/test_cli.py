"""The ``icml26`` command, in-process."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from icml26 import cli
from icml26.cli import main
from icml26.registry import get_paper


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


@pytest.mark.parametrize("argv", [["--debug", "info", "x"], ["info", "x", "--debug"],
                                  ["--debug", "air", "check", "f"], ["air", "check", "f", "--debug"]])
def test_debug_before_or_after_the_subcommand(argv):
    assert cli.build_parser().parse_args(argv).debug is True
    assert cli.build_parser().parse_args([a for a in argv if a != "--debug"]).debug is False


def test_info(capsys):
    assert main(["info", "shampoo"]) == 0
    out = capsys.readouterr().out
    assert "05 shampoo" in out and "check: " in out and "quick: seeds [" in out


def test_info_checks_the_system_programs_an_extra_needs(capsys, monkeypatch):
    """`icml26 info audio_watermark` looks for espeak-ng and lame on PATH, not only for the Python extra."""
    import shutil

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda p, *a, **k: None if p == "lame" else real(p, *a, **k))
    assert main(["info", "audio_watermark"]) == 0
    out = capsys.readouterr().out
    assert "system programs not on PATH: lame (apt-get install -y lame)" in out
    monkeypatch.setattr(shutil, "which", lambda p, *a, **k: f"/usr/bin/{p}")
    assert main(["info", "audio_watermark"]) == 0
    assert "system programs found: espeak-ng, lame" in capsys.readouterr().out


def test_unknown_slug_exits_2_with_close_matches(capsys):
    assert main(["reproduce", "nosuchpaper"]) == 2
    assert "unknown paper 'nosuchpaper'" in capsys.readouterr().err
    assert main(["reproduce", "shampo"]) == 2
    assert "did you mean shampoo" in capsys.readouterr().err
    assert main(["info", "gpca"]) == 2
    assert "did you mean gcpa" in capsys.readouterr().err


def test_planned_paper_says_not_implemented(capsys, monkeypatch, tmp_path):
    paper = dataclasses.replace(get_paper("fedit"), status="planned")    # every card may be implemented by now
    monkeypatch.setattr(cli, "get_paper", lambda slug: paper)
    assert main(["reproduce", "fedit", "--out", str(tmp_path)]) == 2
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


def _demo_cli(monkeypatch, tmp_path, run):
    """Route `icml26 reproduce demo` to a demo card whose experiment is ``run``."""
    from icml26 import runner

    from .helpers import demo_experiment, write_demo_card

    demo = write_demo_card(tmp_path / "tree")
    exp = demo_experiment()
    if run is not None:
        exp.run = run
    monkeypatch.setattr(cli, "get_paper", lambda slug: demo)
    monkeypatch.setattr(runner, "load_experiment", lambda paper: exp)
    return demo


def test_reproduce_needs_slugs_or_all(capsys):
    assert main(["reproduce"]) == 2
    assert "--all" in capsys.readouterr().err
    assert main(["reproduce", "shampoo", "--all"]) == 2


def test_unwritable_out_is_one_line_and_exit_3(capsys, monkeypatch, tmp_path):
    _demo_cli(monkeypatch, tmp_path, None)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["reproduce", "demo", "--out", str(blocker / "sub")]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write results under") and err.count("\n") == 1


def test_ctrl_c_keeps_finished_seeds_and_exits_130(capsys, monkeypatch, tmp_path):
    from .helpers import demo_experiment

    calls = []
    good = demo_experiment().run

    def run(cfg):
        calls.append(cfg.seed)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return good(cfg)

    _demo_cli(monkeypatch, tmp_path, run)
    out = tmp_path / "res"
    assert main(["reproduce", "demo", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted: demo" in err and "quick.partial.json" in err
    import json

    partial = json.loads((out / "demo" / "quick.partial.json").read_text())
    assert partial["complete"] is False and partial["seeds"] == [0, 1]
    assert not (out / "demo" / "quick.json").exists()


def test_a_crashing_experiment_is_one_line(capsys, monkeypatch, tmp_path):
    def run(cfg):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    _demo_cli(monkeypatch, tmp_path, run)
    assert main(["reproduce", "demo", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err == "error: demo: module 'torch' is not installed (pip install the missing package)\n"

    def boom(cfg):
        raise RuntimeError("matrix is singular\nsecond line")

    _demo_cli(monkeypatch, tmp_path, boom)
    assert main(["reproduce", "demo", "--out", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err == "error: demo: RuntimeError: matrix is singular second line\n"


def test_summary_fits_100_columns_and_plots_are_printed(capsys, monkeypatch, tmp_path):
    from .helpers import demo_experiment

    demo = _demo_cli(monkeypatch, tmp_path, None)
    exp = demo_experiment()

    def plot(runs, result, out_dir):
        path = out_dir / f"{result['mode']}_demo.png"
        path.write_bytes(b"png")
        return [path]

    exp.plot = plot
    from icml26 import runner

    monkeypatch.setattr(runner, "load_experiment", lambda paper: exp)
    assert demo.slug == "demo"
    assert main(["reproduce", "demo", "--out", str(tmp_path / "r")]) == 0
    captured = capsys.readouterr()
    assert all(len(line) <= 100 for line in captured.out.splitlines())
    assert "gain" in captured.out and "holds" in captured.out
    assert f"demo: plot {tmp_path / 'r' / 'demo' / 'quick_demo.png'}" in captured.err


def test_reproduce_writes_to_a_scratch_directory_by_default(capsys, monkeypatch, tmp_path):
    """Without --out the result goes to ./runs, never over a clone's committed ./results (issue #45 item 5)."""
    _demo_cli(monkeypatch, tmp_path, None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "demo").mkdir(parents=True)
    assert main(["reproduce", "demo"]) == 0
    assert (tmp_path / "runs" / "demo" / "quick.json").is_file()
    assert list((tmp_path / "results" / "demo").iterdir()) == []
    assert f"demo: wrote {Path('runs') / 'demo' / 'quick.json'}" in capsys.readouterr().err


def test_smoke_says_its_verdicts_are_not_evidence(capsys, monkeypatch, tmp_path):
    _demo_cli(monkeypatch, tmp_path, None)
    assert main(["reproduce", "demo", "--mode", "smoke", "--out", str(tmp_path / "r")]) == 0
    assert "are not evidence" in capsys.readouterr().err
    assert main(["reproduce", "demo", "--mode", "quick", "--out", str(tmp_path / "r")]) == 0
    assert "are not evidence" not in capsys.readouterr().err


def test_mode_help_describes_the_presets(capsys):
    assert main(["reproduce", "--help"]) == 0
    out = capsys.readouterr().out
    assert "smoke" in out and "under 2 minutes" in out and "15 minutes" in out


def _clear_llm_environment(monkeypatch):
    """Unset ICML26_LLM_* for the test and restore them after (setenv first, so teardown also removes what the CLI
    exports)."""
    for name in ("ENDPOINT", "MODEL", "TIMEOUT"):
        monkeypatch.setenv(f"ICML26_LLM_{name}", "")
        monkeypatch.delenv(f"ICML26_LLM_{name}")


def test_reproduce_llm_options_reach_the_experiment_as_environment(capsys, monkeypatch, tmp_path):
    import os

    _clear_llm_environment(monkeypatch)
    seen = {}

    from .helpers import demo_experiment

    good = demo_experiment().run

    def run(cfg):
        seen.update({k: os.environ.get(f"ICML26_LLM_{k}") for k in ("ENDPOINT", "MODEL", "TIMEOUT")})
        return good(cfg)

    _demo_cli(monkeypatch, tmp_path, run)
    argv = ["reproduce", "demo", "--out", str(tmp_path / "r"), "--llm-endpoint", "http://127.0.0.1:9/v1",
            "--llm-model", "m", "--llm-timeout", "5"]
    assert main(argv) == 0
    assert seen == {"ENDPOINT": "http://127.0.0.1:9/v1", "MODEL": "m", "TIMEOUT": "5.0"}


@pytest.mark.parametrize("extra, message", [
    (["--llm-endpoint", "http://x/v1"], "--llm-endpoint needs a model name"),
    (["--llm-model", "m"], "need an endpoint"),
    (["--llm-endpoint", "http://x/v1", "--llm-model", "m", "--llm-timeout", "0"], "--llm-timeout must be a positive"),
])
def test_reproduce_bad_llm_options_exit_2(extra, message, capsys, monkeypatch, tmp_path):
    _clear_llm_environment(monkeypatch)
    _demo_cli(monkeypatch, tmp_path, None)
    assert main(["reproduce", "demo", "--out", str(tmp_path / "r"), *extra]) == 2
    assert message in capsys.readouterr().err


def test_reproduce_refuses_to_replace_a_result_of_other_seeds(tmp_path, capsys):
    import json

    from icml26.cli import main

    target = tmp_path / "inverse_optimization"
    target.mkdir()
    (target / "smoke.json").write_text(json.dumps({"seeds": [7, 8]}))
    assert main(["reproduce", "inverse_optimization", "--mode", "smoke", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds a result of seeds [7, 8]" in err and "--force" in err
    assert json.loads((target / "smoke.json").read_text()) == {"seeds": [7, 8]}  # untouched
