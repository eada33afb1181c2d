"""The shared model cache (``common.cache``): round trip, atomic writes, healing, no unpickling, permissions."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import pytest

from icml26.common import cache
from icml26.common.cache import MANIFEST, CacheWarning, cached_entry, cached_json, key_digest, load_tensors


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("ICML26_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _save(value: str, path: Path) -> None:
    (path / "value.txt").write_text(value)


def _load(path: Path) -> str:
    text = (path / "value.txt").read_text()
    if not text.startswith("v"):
        raise ValueError(f"garbage in {path}")
    return text


def _counting(value="v1"):
    """A build function that counts its calls; ``value`` may be a callable that makes the value."""
    calls = []

    def build():
        calls.append(1)
        return value() if callable(value) else value

    return build, calls


def _entry(root: Path, key: dict) -> Path:
    """The generic entry of ``key`` built by any function of this file (they share this file's code digest)."""
    return root / "ns" / key_digest(key, _entry)


def _temps(root: Path) -> list[Path]:
    return list(root.rglob(".tmp-*")) if root.exists() else []


# ------------------------------------------------------------------------------------------- the real lab models
@pytest.fixture(scope="module")
def lab():
    pytest.importorskip("transformers")
    from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm

    tok = char_tokenizer()
    return tok, lambda seed: tiny_causal_lm(len(tok), hidden=16, layers=1, intermediate=32, seed=seed)


def _state(model) -> list:
    """A copy of the weights (a loaded model maps its cache file: damaging that file in place would fault it)."""
    return [v.clone() for v in model.state_dict().values()]


def _same(m1, m2) -> bool:
    import torch

    s1 = m1 if isinstance(m1, list) else _state(m1)
    return all(torch.equal(p, q) for p, q in zip(s1, _state(m2), strict=True))


def test_round_trip_of_a_lab_model_builds_once_and_writes_normal_permissions(root, lab):
    from icml26.common.tiny_lm import cached

    tok, make = lab
    build, calls = _counting(lambda: (make(3), tok))

    m1, _ = cached({"k": "rt"}, build)
    m2, tok2 = cached({"k": "rt"}, build)
    assert len(calls) == 1 and _same(m1, m2) and len(tok2) == len(tok)
    entry = root / "tiny_lm" / key_digest({"k": "rt"}, _entry)
    assert {"config.json", "model.safetensors", MANIFEST, "icml26_key.json"} <= {p.name for p in entry.iterdir()}
    assert not any(p.suffix in (".bin", ".pt") for p in entry.iterdir())  # safetensors only: nothing to unpickle
    mask = _umask()
    assert entry.stat().st_mode & 0o777 == 0o777 & ~mask  # not mkdtemp's 0700
    for p in entry.iterdir():
        assert p.stat().st_mode & 0o777 == 0o666 & ~mask, p.name
    assert not _temps(root)


def test_a_truncated_weights_file_is_detected_removed_and_rebuilt(root, lab):
    from icml26.common.tiny_lm import cached

    tok, make = lab
    build, calls = _counting(lambda: (make(4), tok))

    m1, _ = cached({"k": "trunc"}, build)
    m1 = _state(m1)
    weights = root / "tiny_lm" / key_digest({"k": "trunc"}, _entry) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.warns(CacheWarning, match="truncated or overwritten"):
        m2, _ = cached({"k": "trunc"}, build)
    assert len(calls) == 2 and _same(m1, m2)
    m3, _ = cached({"k": "trunc"}, build)  # healed: a hit again
    assert len(calls) == 2 and _same(m1, m3)


def test_a_legacy_entry_without_manifest_loads_and_heals_when_half_written(root, lab):
    from icml26.common.tiny_lm import cached

    tok, make = lab
    build, calls = _counting(lambda: (make(5), tok))

    m1, _ = cached({"k": "legacy"}, build)
    m1 = _state(m1)
    entry = root / "tiny_lm" / key_digest({"k": "legacy"}, _entry)
    (entry / MANIFEST).unlink()  # what icml26 wrote before manifests existed
    m2, _ = cached({"k": "legacy"}, build)
    assert len(calls) == 1 and _same(m1, m2)
    (entry / "config.json").unlink()  # half-written: the entry issue #45 saw fail on every later run
    with pytest.warns(CacheWarning, match="unreadable entry"):
        m3, _ = cached({"k": "legacy"}, build)
    assert len(calls) == 2 and _same(m1, m3) and (entry / MANIFEST).is_file()


# ---------------------------------------------------------------------------------------------- generic entries
def test_round_trip_and_key_separation(root):
    build, calls = _counting("v1")
    assert cached_entry("ns", {"a": 1}, build, save=_save, load=_load) == "v1"
    assert cached_entry("ns", {"a": 1}, build, save=_save, load=_load) == "v1"
    assert cached_entry("ns", {"a": 2}, build, save=_save, load=_load) == "v1"
    assert len(calls) == 2
    assert json.loads((_entry(root, {"a": 1}) / "icml26_key.json").read_text()) == {"a": 1}


@pytest.mark.parametrize("damage", ["garbage", "truncated", "extra_file", "file_at_entry", "bad_manifest"])
def test_a_damaged_entry_heals_with_a_warning(root, damage):
    build, calls = _counting("v1")
    cached_entry("ns", {"a": 1}, build, save=_save, load=_load)
    entry = _entry(root, {"a": 1})
    if damage == "garbage":
        (entry / "value.txt").write_bytes(os.urandom(64))
    elif damage == "truncated":
        (entry / "value.txt").write_text("v")
    elif damage == "extra_file":
        (entry / "stray.json").write_text("{}")
    elif damage == "bad_manifest":
        (entry / MANIFEST).write_text("{not json")
    else:
        for p in entry.iterdir():
            p.unlink()
        entry.rmdir()
        entry.write_bytes(b"\x00garbage")
    with pytest.warns(CacheWarning, match=str(entry)):
        assert cached_entry("ns", {"a": 1}, build, save=_save, load=_load) == "v1"
    assert len(calls) == 2 and not _temps(root)
    assert cached_entry("ns", {"a": 1}, build, save=_save, load=_load) == "v1" and len(calls) == 2


def test_garbage_that_passes_no_manifest_is_caught_by_the_loader_and_healed(root):
    build, calls = _counting("v1")
    cached_entry("ns", {"a": 1}, build, save=_save, load=_load)
    entry = _entry(root, {"a": 1})
    (entry / MANIFEST).unlink()
    (entry / "value.txt").write_text("garbage")
    with pytest.warns(CacheWarning, match="ValueError"):
        assert cached_entry("ns", {"a": 1}, build, save=_save, load=_load) == "v1"
    assert len(calls) == 2


def test_no_temp_left_and_no_entry_after_the_builder_or_the_save_raises(root):
    def failing_build():
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        cached_entry("ns", {"a": 1}, failing_build, save=_save, load=_load)

    def failing_save(value, path):
        (path / "value.txt").write_text("v-half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        cached_entry("ns", {"a": 1}, lambda: "v1", save=failing_save, load=_load)
    assert not _temps(root)
    assert not _entry(root, {"a": 1}).exists()
    assert cached_entry("ns", {"a": 1}, lambda: "v1", save=_save, load=_load) == "v1"


def test_a_concurrent_writer_that_publishes_first_wins_and_nothing_is_corrupted(root):
    def slow_build():
        # another process finishes the same entry while this one is still building
        cached_entry("ns", {"a": 1}, lambda: "v-first", save=_save, load=_load)
        return "v-second"

    assert cached_entry("ns", {"a": 1}, slow_build, save=_save, load=_load) == "v-first"
    assert not _temps(root)
    cache.verify_entry(_entry(root, {"a": 1}))


def test_stale_temps_of_killed_writers_are_swept(root):
    stale = root / "ns" / ".tmp-killed"
    stale.mkdir(parents=True)
    (stale / "value.txt").write_text("v-half")
    old = time.time() - 2 * cache.STALE_TMP_S
    os.utime(stale, (old, old))
    fresh = root / "ns" / ".tmp-busy"
    fresh.mkdir()
    cached_entry("ns", {"a": 1}, lambda: "v1", save=_save, load=_load)
    assert not stale.exists() and fresh.exists()


def test_a_read_only_cache_runs_uncached(root, monkeypatch):
    mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.name.startswith(".tmp-"):
            raise PermissionError(13, "Read-only file system", str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.warns(CacheWarning, match="not writable"):
        assert cached_entry("ns", {"a": 1}, lambda: "v1", save=_save, load=_load) == "v1"
    assert not _entry(root, {"a": 1}).exists() and not _temps(root)


def test_an_entry_that_cannot_be_published_is_used_uncached(root, monkeypatch):
    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))

    monkeypatch.setattr(cache.os, "replace", refuse)
    with pytest.warns(CacheWarning, match="could not publish"):
        assert cached_entry("ns", {"a": 1}, lambda: "v1", save=_save, load=_load) == "v1"
    assert not _entry(root, {"a": 1}).exists() and not _temps(root)


# ------------------------------------------------------------------------------------------------ no unpickling
class _Payload:
    """A pickled object that would run code when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


def test_weights_only_refuses_a_pickled_arbitrary_object(tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "ran"
    torch.save({"w": _Payload(marker)}, tmp_path / "evil.pt")
    with pytest.raises(pickle.UnpicklingError):
        load_tensors(tmp_path / "evil.pt")
    assert not marker.exists()
    torch.save({"w": torch.arange(3.0)}, tmp_path / "ok.pt")
    assert torch.equal(load_tensors(tmp_path / "ok.pt")["w"], torch.arange(3.0))


def test_a_pickle_planted_in_an_entry_is_never_loaded(root, tmp_path):
    marker = tmp_path / "ran"
    build, calls = _counting("v1")
    cached_entry("ns", {"a": 1}, build, save=_save, load=_load)
    entry = _entry(root, {"a": 1})
    (entry / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["files"]["pytorch_model.bin"] = cache._sha256(entry / "pytorch_model.bin")  # even with a forged manifest
    (entry / MANIFEST).write_text(json.dumps(manifest))

    def unpickling_load(path: Path) -> str:
        for p in path.glob("*.bin"):
            pickle.loads(p.read_bytes())
        return _load(path)

    with pytest.warns(CacheWarning, match="pickle"):
        assert cached_entry("ns", {"a": 1}, build, save=_save, load=unpickling_load) == "v1"
    assert not marker.exists() and len(calls) == 2


# -------------------------------------------------------------------------------------------------- JSON entries
def test_json_entries_round_trip_heal_and_keep_the_stored_format(root):
    calls = []

    def compute():
        calls.append(1)
        return {"val_accuracy": 0.5}

    assert cached_json("tuning", {"arm": "x"}, compute) == {"val_accuracy": 0.5}
    assert cached_json("tuning", {"arm": "x"}, compute) == {"val_accuracy": 0.5}
    path = root / "tuning" / f"{key_digest({'arm': 'x'}, _entry)}.json"
    assert json.loads(path.read_text()) == {"key": {"arm": "x"}, "val_accuracy": 0.5}
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()
    path.write_text('{"key": {"arm": "x"}, "val_acc')  # truncated
    with pytest.warns(CacheWarning, match="unreadable"):
        assert cached_json("tuning", {"arm": "x"}, compute) == {"val_accuracy": 0.5}
    assert len(calls) == 2 and not _temps(root)
    assert len(list((root / "tuning").iterdir())) == 1


# ------------------------------------------------------------------------------------------ keyed by the code
def _module(tmp_path: Path, name: str, body: str):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(body)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_an_edit_to_the_code_that_builds_an_entry_misses_the_old_entry(root, tmp_path, monkeypatch):
    first = _module(tmp_path, "icml26_cache_builder_a", "def build():\n    return 'v1'\n")
    monkeypatch.setitem(__import__("sys").modules, "icml26_cache_builder_a", first)
    assert cached_entry("ns", {"a": 1}, first.build, save=_save, load=_load) == "v1"
    digest = cache.code_digest(first.build)
    assert cache.code_digest(first.build) == digest  # stable
    edited = _module(tmp_path, "icml26_cache_builder_a", "def build():\n    return 'v2'  # the training changed\n")
    assert cache.code_digest(edited.build) != digest
    assert cached_entry("ns", {"a": 1}, edited.build, save=_save, load=_load) == "v2"  # not the stale 'v1'
    assert len([p for p in (root / "ns").iterdir() if not p.name.startswith(".")]) == 2


def test_the_code_digest_covers_the_paper_package_and_common():
    import functools

    from icml26.common import tiny_lm
    from icml26.spard import experiment as spard_experiment

    lab_only = cache.code_digest(tiny_lm.cached)
    paper = cache.code_digest(spard_experiment._lab_key)
    assert lab_only != paper
    assert cache.code_digest(functools.partial(spard_experiment._lab_key, role="x")) == paper
    assert cache._tree_digest.cache_info().currsize >= 2  # common/ and spard/ hashed once each
    other = cache.code_digest(cache.cached_json)  # another common function: the same code digest as tiny_lm's
    assert other == lab_only
