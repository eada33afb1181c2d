"""The ``icml26`` command, in-process."""

from __future__ import annotations

import dataclasses
import re
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


def test_air_proxy_missing_upstream_is_one_line(capsys, tmp_path):
    """`icml26 air proxy -- /nonexistent` names the command in one line (it printed a traceback, exit 1); an
    upstream that exits at once is one line too."""
    import sys

    pytest.importorskip("lark")
    rules = tmp_path / "r.air"
    rules.write_text('rule r on before_action(x) detect : call.args.a == "b" contain - block end\n')
    assert main(["air", "proxy", "--rules", str(rules), "--", "/nonexistent", "--flag"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["error: upstream command not found: /nonexistent"]
    pytest.importorskip("mcp")
    assert main(["air", "proxy", "--rules", str(rules), "--", sys.executable, "-c", "pass"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and sys.executable in err, err


HOSTILE_RULE_FILES = {  # name -> (bytes, line, column): each printed a traceback or must stay positioned
    "control_char.air": (b'rule r on after_action(x)\ndetect : call.args.a == "a\x01b" contain - block end\n', 2, 27),
    "tab_in_string.air": (b'rule r on after_action(x) detect : call.args.a == "a\tb" end\n', 1, 53),
    "huge_number.air": (b"rule r on after_action(x) detect : call.args.a == " + b"9" * 5000 + b" end\n", 1, 51),
    "bad_escape.air": (b'rule r on after_action(x) detect : call.args.a == "\\u12" end\n', 1, 52),
    "huge_float.air": (b"rule r on after_action(x) detect : call.args.a == 1e999 end\n", 1, 51),
    "deep_brackets.air": (b"rule r on after_action(x) detect : " + b"(" * 10_000 + b"call.a == 1 end\n", 1, 68),
    "deep_not.air": (b"rule r on finish detect : " + b"not " * 5000 + b"call.a == 1 end\n", 1, None),
    "unterminated.air": (b'rule r on finish detect : call.a == "abc\nend\n', 1, 37),
    "bad_bytes.air": (b'rule r on finish\ndetect : call.a == "caf\xe9\xff" end\n', 2, 24),
    "nul.air": (b"rule r on finish\x00 detect : call.a == 1 end\n", 1, 17),
}


def test_air_check_reports_hostile_files_as_file_line_column_never_a_traceback(tmp_path, capsys):
    """`icml26 air check` on a control character in a string, a 5,000-digit number, deep nesting or bytes that
    are not UTF-8: one `file:line:column: message` line each and exit 1 (the first four printed a traceback,
    1e999 was accepted as infinity)."""
    pytest.importorskip("lark")
    for name, (data, line, col) in HOSTILE_RULE_FILES.items():
        f = tmp_path / name
        f.write_bytes(data)
        assert main(["air", "check", str(f)]) == 1, name
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err and err == "", name
        [printed] = out.strip().splitlines()
        m = re.fullmatch(re.escape(str(f)) + r":(\d+):(\d+): (.+)", printed)
        assert m and int(m[1]) == line and (col is None or int(m[2]) == col), printed
    files = [str(tmp_path / n) for n in HOSTILE_RULE_FILES]
    assert main(["air", "check", *files]) == 1      # all at once: one line per file
    out = capsys.readouterr().out.strip().splitlines()
    assert [o.split(":", 1)[0] for o in out] == files


def test_air_check_manifest_refuses_what_cannot_fire(tmp_path, capsys):
    """`air check --manifest` reaches the manifest lint: a misspelt argument, state key or tool is an error
    there and fine without it; a manifest that is neither a file nor a shipped name is a usage error."""
    pytest.importorskip("lark")
    f = tmp_path / "typos.air"
    f.write_text('rule ok on after_action(email.send) detect : call.args.to != "" contain - block end\n'
                 'rule bad_arg on after_action(email.send) detect : call.args.too != "" contain - block end\n'
                 'rule bad_state on finish detect : state.inbxo == [] end\n'
                 'rule bad_tool on after_action(email.sned) detect : call.name != "" contain - block end\n')
    assert main(["air", "check", str(f)]) == 0
    assert "ok (4 rules)" in capsys.readouterr().out
    assert main(["air", "check", "--manifest", "email", str(f)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        f"{f}:2:1: rule bad_arg: call.args.too: no parameter 'too' in email.send (did you mean 'to'?)",
        f"{f}:3:1: rule bad_state: state.inbxo: the state has no key 'inbxo' here (keys: calendar, contacts, "
        "drive, forwarding, inbox, password, sent, trash, web) (did you mean 'inbox'?)",
        f"{f}:4:1: rule bad_tool: trigger tool 'email.sned' matches no declared tool (did you mean 'email.send'?)",
    ]
    assert main(["air", "check", "--manifest", "nowhere", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no such manifest file, nor a shipped manifest: nowhere")
    # a manifest file (the format of `air proxy --manifest`)
    toml = tmp_path / "tools.toml"
    toml.write_text('[tools."email.send"]\neffects = ["sends_out"]\ntargets = ["to"]\n')
    assert main(["air", "check", "--manifest", str(toml), str(f)]) == 1
    out = capsys.readouterr().out
    assert "rule bad_tool: trigger tool 'email.sned'" in out and "call.args.too" not in out  # args undeclared
