"""Packaging: per-paper extras, and the built wheel installed as users install it (slow: fresh venvs)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from icml26.registry import EXTRAS, list_papers, paper_extra

from .conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OPTIONAL = PYPROJECT["project"]["optional-dependencies"]


def test_every_paper_has_its_own_extra_and_cards_name_known_extras():
    assert set(EXTRAS) <= set(OPTIONAL) | {"all"}
    for p in list_papers():
        assert paper_extra(p.slug) in OPTIONAL, f"pyproject.toml has no extra for {p.slug}"
        assert paper_extra(p.slug) in p.extras, f"{p.slug}: its card should name its own extra"


def test_shipped_files_reference_nothing_outside_the_repository():
    """Docs, metadata and code name no path above the repository root (issue #45: `../shared/...` notes that a
    reader of a clone or a wheel does not have). The card cross-check in test_registry may look for them."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    offenders = []
    for rel in tracked.split():
        if rel.startswith("results/") or rel == "tests/test_registry.py" or rel == "tests/test_packaging.py":
            continue
        path = ROOT / rel
        if path.suffix not in {".md", ".py", ".toml", ".cfg", ".txt", ".yml", ".yaml", ""} or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if "../shared" in text:
            offenders.append(rel)
    assert offenders == []


def test_torch_is_not_a_core_dependency():
    core = " ".join(PYPROJECT["project"]["dependencies"])
    assert "torch" not in core
    for extra in ("inverse-optimization", "branch-and-cut", "fedit"):
        assert not any("torch" in r for r in OPTIONAL[extra])
    assert not any(peer in " ".join(OPTIONAL["shampoo"]) for peer in ("pytorch-optimizer", "pyscipopt", "cca-zoo"))


def _run(cmd: list[str], cwd: Path | None = None, env: dict | None = None, timeout: float = 900) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)])
    wheel = next(out.glob("icml26-*.whl"))
    sdist = next(out.glob("icml26-*.tar.gz"))
    return wheel, sdist


def _venv(path: Path) -> Path:
    _run([sys.executable, "-m", "venv", str(path)])
    return path / "bin" / "python"


@pytest.mark.slow
def test_wheel_carries_cards_and_embedded_data(built):
    wheel, sdist = built
    names = set(zipfile.ZipFile(wheel).namelist())
    for p in list_papers():
        assert f"icml26/{p.slug}/paper.toml" in names
    assert "icml26/common/data/docstrings.tsv" in names
    assert any(n.startswith("icml26/air/rules/") and n.endswith(".air") for n in names)
    assert sdist.stat().st_size > 0


@pytest.mark.slow
def test_branch_and_cut_runs_from_the_wheel_without_torch(built, tmp_path):
    wheel, _ = built
    py = _venv(tmp_path / "venv")
    _run([str(py), "-m", "pip", "install", "-q", f"{wheel}[branch-and-cut]"])
    probe = _run([str(py), "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"])
    assert probe.strip() == "True"
    out = tmp_path / "results"
    _run([str(py), "-m", "icml26", "reproduce", "branch_and_cut", "--mode", "smoke", "--out", str(out)],
         env={"ICML26_PROGRESS": "0"})
    assert (out / "branch_and_cut" / "smoke.json").is_file()
    # a paper that needs torch, imported without it: the error names its extra (issue #45 item 8)
    for slug in ("shampoo", "vq_rank"):  # both import torch with the package
        proc = subprocess.run([str(py), "-c", f"import icml26.{slug}"], capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr, slug
        assert f'pip install "icml26[{paper_extra(slug)}]"' in proc.stderr, proc.stderr[-2000:]
        assert "MissingExtraModuleError" in proc.stderr


@pytest.mark.slow
def test_shampoo_trains_from_the_wheel(built, tmp_path):
    wheel, _ = built
    py = _venv(tmp_path / "venv")
    _run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0"])
    _run([str(py), "-m", "pip", "install", "-q", f"{wheel}[shampoo]"])
    script = (
        "import torch; from icml26.shampoo import Shampoo\n"
        "torch.manual_seed(0); m = torch.nn.Linear(8, 4); opt = Shampoo(m.parameters(), lr=1e-2)\n"
        "x, y = torch.randn(64, 8), torch.randn(64, 4)\n"
        "first = None\n"
        "for _ in range(30):\n"
        "    opt.zero_grad(); loss = ((m(x) - y) ** 2).mean(); loss.backward(); opt.step()\n"
        "    first = float(loss) if first is None else first\n"
        "print(first > float(loss), torch.__version__)\n")
    out = _run([str(py), "-c", script]).split()
    assert out[0] == "True" and out[1].startswith("2.13.0")
