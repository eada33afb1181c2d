"""common.optional: missing extras named, never a silent fallback; the import-hint finder (issue #45 item 8)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import subprocess
import sys

import pytest

import icml26  # noqa: F401  (installs the finder)
from icml26.common.optional import (
    MissingExtraError,
    MissingExtraModuleError,
    has,
    install_hint,
    install_import_hints,
    requires,
)

MISSING = "no_such_distribution_xyz"


def _import_as(module_name: str, statement: str) -> None:
    """Run an import statement as if written in the module ``module_name``."""
    exec(statement, {"__name__": module_name})


def test_requires_names_the_extra_and_has_checks_without_importing():
    assert has("math") and not has(MISSING)
    with pytest.raises(MissingExtraError, match=r'pip install "icml26\[fl\]"') as info:
        requires(MISSING, extra="fl", purpose="the Flower run")
    assert "the Flower run" in str(info.value)


def test_a_paper_importing_a_missing_package_names_its_extra():
    with pytest.raises(ModuleNotFoundError) as info:
        _import_as("icml26.spard.experiment", f"import {MISSING}")
    assert isinstance(info.value, MissingExtraModuleError) and info.value.name == MISSING
    assert f"No module named '{MISSING}'" in str(info.value)
    assert install_hint("spard") in str(info.value) and 'pip install -e ".[spard]"' in str(info.value)
    with pytest.raises(MissingExtraModuleError, match=r"icml26\[audio-watermark\]"):  # slug -> extra
        _import_as("icml26.audio_watermark.core", f"from {MISSING} import thing")


def test_a_common_module_without_a_paper_on_the_stack_gets_a_general_hint():
    with pytest.raises(MissingExtraModuleError, match="icml26 info SLUG"):
        _import_as("icml26.common.tiny_lm", f"import {MISSING}")


def test_other_importers_and_probes_see_the_plain_error():
    with pytest.raises(ModuleNotFoundError) as info:
        _import_as("someone_else", f"import {MISSING}")
    assert not isinstance(info.value, MissingExtraError)
    # a probe through importlib (how libraries look for optional packages) still answers None, even from icml26
    assert _probe_from_icml26() is None
    with pytest.raises(ModuleNotFoundError) as info:  # submodules of a present package: the plain error
        _import_as("icml26.spard.experiment", f"import json.{MISSING}")
    assert not isinstance(info.value, MissingExtraError)


def _probe_from_icml26():
    namespace = {"__name__": "icml26.spard.experiment", "importlib": importlib}
    exec(f"result = importlib.util.find_spec({MISSING!r})", namespace)
    return namespace["result"]


def test_the_finder_is_installed_once_and_yields_to_finders_added_after_it(monkeypatch):
    install_import_hints()
    install_import_hints()
    assert [type(f).__name__ for f in sys.meta_path].count("_ImportHintFinder") == 1

    class Empty(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            module.answer = 42

    class Alias:  # a library's finder appended later (e.g. legacy module aliases) still answers
        def find_spec(self, fullname, path=None, target=None):
            return importlib.util.spec_from_loader(fullname, Empty()) if fullname == MISSING else None

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Alias()])
    monkeypatch.delitem(sys.modules, MISSING, raising=False)
    namespace = {"__name__": "icml26.spard.experiment"}
    exec(f"import {MISSING} as found", namespace)  # an icml26 import statement: the later finder's module
    assert namespace["found"].answer == 42
    monkeypatch.delitem(sys.modules, MISSING)


def test_a_fresh_interpreter_gets_the_hint_from_a_plain_import_of_icml26():
    code = f"import icml26; exec('import {MISSING}', {{'__name__': 'icml26.coca.core'}})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and 'pip install "icml26[coca]"' in proc.stderr
