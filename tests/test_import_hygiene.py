"""``import icml26`` (and the CLI's list/info/report paths) must stay cheap: no heavy extras imported."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "flwr", "ray", "transformers", "trl", "peft", "accelerate", "datasets", "langchain", "sklearn",
         "matplotlib", "scipy")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_icml26_loads_nothing_heavy():
    assert _loaded_after("import icml26") == []


def _cli(*calls: str) -> str:
    return ("import contextlib, io\nfrom icml26.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            + "".join(f"    main({c})\n" for c in calls))


def test_cli_list_info_load_nothing_heavy():
    assert _loaded_after(_cli("['list']", "['info', 'shampoo']")) == []


def test_cli_report_loads_only_scipy():
    """``report`` recomputes every verdict (t quantiles, Clopper-Pearson): scipy, a core dependency. (``report
    --check`` also imports each experiment whose extras are installed, to compare the stored configs with the
    presets.)"""
    assert _loaded_after(_cli("['report']")) == ["scipy"]


def test_paper_packages_do_not_import_extras():
    """A paper package may import torch (a core dependency) but no extra until a function needs it."""
    from icml26.registry import list_papers

    slugs = [p.slug for p in list_papers()]
    code = "import icml26\n" + "\n".join(f"icml26.{s}" for s in slugs)
    extras = {"flwr", "ray", "transformers", "trl", "peft", "accelerate", "datasets", "langchain"}
    assert set(_loaded_after(code)) & extras == set()


def test_lazy_attributes():
    import icml26

    assert icml26.registry.__name__ == "icml26.registry"
    try:
        icml26.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")
