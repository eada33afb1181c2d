"""The result format: aggregation, schema, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from icml26.common import io as icml_io
from icml26.common.claims import RULES
from icml26.common.results import (
    ResultSchemaError,
    SeedRun,
    aggregate_arms,
    read_result,
    summarize,
    validate_result,
    write_result,
)


def good_result() -> dict:
    return {
        "slug": "demo", "mode": "quick", "seeds": [0, 1], "config": {"gap": 0.1},
        "arms": {"method": {"acc": summarize([0.8, 0.9])}},
        "claims": [{"id": "c", "text": "t", "check": "method.acc >= 0.5 over seeds", "kind": "evidence",
                    "min_effect_why": "w", "paper": {"value": "1", "where": "T1", "scale": "s"},
                    "ours": "method.acc = 0.85", "verdict": "holds", "holds": True, "estimate": 0.85,
                    "interval": [0.53, 1.17], "test": "t", "units": "2 seed(s)", "per_seed": [0.8, 0.9],
                    "why": "w", "notes": [], "direction": "higher", "headline": True,
                    "design": {"clusters": 2, "distinct_units": 2, "design_effect": 1.0, "within_duplicates": 0}}],
        "provenance": {"card_sha256": "0" * 64, "sources": {}},
        "env": {"python": "3.11"}, "complete": True, "wall_s": 1.5, "created": "2026-11-30T00:00:00+00:00",
        "rules": RULES, "unit_ids": {}, "overlap": {},
        "headline": {"id": "c", "verdict": "holds", "decidable": True, "preconditions": {}},
    }


def test_summarize_matches_numpy_sample_std():
    values = [0.3, 0.1, 0.7, 0.2]
    s = summarize(values)
    assert s["mean"] == pytest.approx(np.mean(values))
    assert s["std"] == pytest.approx(np.std(values, ddof=1))
    assert summarize([2.0]) == {"mean": 2.0, "std": 0.0, "values": [2.0]}
    with pytest.raises(ValueError):
        summarize([])


def test_aggregate_requires_the_same_arms_on_every_seed():
    with pytest.raises(ValueError, match="different arm/metric"):
        aggregate_arms([SeedRun({"a": {"x": 1.0}}), SeedRun({"a": {"y": 1.0}})])
    out = aggregate_arms([SeedRun({"a": {"x": 1.0}, "b": {"x": 0.0}}), SeedRun({"a": {"x": 3.0}, "b": {"x": 0.0}})])
    assert out["a"]["x"]["values"] == [1.0, 3.0] and out["a"]["x"]["mean"] == 2.0


def test_units_fill_the_per_seed_value_and_are_stored_per_seed(tmp_path):
    runs = [SeedRun({"a": {"n": 1.0}}, units={"items": {"a": {"ok": [1, 0, 1, 1]}, "b": {"ok": [0, 0, 1, 1]}}}),
            SeedRun({"a": {"n": 2.0}}, units={"items": {"a": {"ok": [1, 1, 1, 1]}, "b": {"ok": [0, 1, 0, 0]}}})]
    assert runs[0].metrics["a"]["ok"] == 0.75 and runs[0].unit_of("b", "ok") == "items"
    out = aggregate_arms(runs)
    assert out["a"]["ok"] == {"mean": 0.875, "std": pytest.approx(0.1767767), "values": [0.75, 1.0],
                              "unit": "items", "unit_values": [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]}
    assert "unit" not in out["a"]["n"]
    data = good_result()
    data["arms"] = out
    path = write_result(tmp_path / "r.json", data)
    text = path.read_text()
    assert "[1,0,1,1],\n" in text  # one seed per line, whole numbers as ints
    assert read_result(path)["arms"] == json.loads(json.dumps(out))


def test_units_must_agree_with_given_metrics():
    with pytest.raises(ValueError, match="is not the mean of its items"):
        SeedRun({"a": {"ok": 0.5}}, units={"items": {"a": {"ok": [1, 1]}}})
    with pytest.raises(ValueError, match="unit names"):
        SeedRun({"a": {"x": 1.0}}, units={"seeds": {"a": {"ok": [1]}}})
    with pytest.raises(TypeError, match="non-empty list"):
        SeedRun({"a": {"x": 1.0}}, units={"items": {"a": {"ok": []}}})
    with pytest.raises(ValueError, match="disagree"):
        aggregate_arms([SeedRun({}, units={"items": {"a": {"ok": [1.0]}}}),
                        SeedRun({}, units={"other": {"a": {"ok": [1.0]}}})])


@pytest.mark.parametrize("metrics", [{}, {"a": {"x": "high"}}, {"a": {"x": True}}, {"a": [1.0]}])
def test_seedrun_rejects_bad_metrics(metrics):
    with pytest.raises(TypeError):
        SeedRun(metrics)


def test_validate_accepts_and_rejects():
    validate_result(good_result())
    for mutate, msg in [
        (lambda d: d.pop("rules"), "must be regenerated"),
        (lambda d: d.update(rules=2), "must be regenerated"),
        (lambda d: d["claims"][0].pop("design"), "missing keys"),
        (lambda d: d.pop("env"), "missing keys"),
        (lambda d: d.update(mode="fast"), "mode must be"),
        (lambda d: d.update(seeds=[]), "seeds"),
        (lambda d: d["arms"]["method"]["acc"].update(values=[1.0]), "one value per seed"),
        (lambda d: d["arms"]["method"]["acc"].pop("std"), "must have mean, std, values"),
        (lambda d: d["arms"]["method"]["acc"].update(unit="items"), "must have mean, std, values"),
        (lambda d: d["arms"]["method"]["acc"].update(unit="items", unit_values=[[1.0]]), "one non-empty list"),
        (lambda d: d["claims"][0].update(holds="yes"), "holds must equal"),
        (lambda d: d["claims"][0].update(verdict="inconclusive"), "holds must equal"),
        (lambda d: d["claims"][0].update(verdict="yes"), "verdict must be one of"),
        (lambda d: d["claims"][0].update(kind="proof"), "kind must be one of"),
        (lambda d: d["claims"][0].update(interval=[0.5]), "interval"),
        (lambda d: d["claims"][0].pop("why"), "missing keys"),
        (lambda d: d.pop("provenance"), "missing keys"),
        (lambda d: d.update(provenance={}), "provenance must hold"),
        (lambda d: d.update(complete="yes"), "complete must be"),
        (lambda d: d.update(wall_s=-1), "wall_s"),
    ]:
        data = good_result()
        mutate(data)
        with pytest.raises(ResultSchemaError, match=msg):
            validate_result(data)


def test_write_then_read_round_trip(tmp_path):
    path = write_result(tmp_path / "demo" / "quick.json", good_result())
    assert read_result(path) == json.loads(json.dumps(good_result()))
    assert os.listdir(tmp_path / "demo") == ["quick.json"]


def test_invalid_result_writes_nothing(tmp_path):
    data = good_result()
    data.pop("claims")
    with pytest.raises(ResultSchemaError):
        write_result(tmp_path / "demo" / "quick.json", data)
    assert not (tmp_path / "demo" / "quick.json").exists()


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "demo" / "quick.json"
    write_result(target, good_result())
    before = target.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(icml_io.os, "replace", boom)
    changed = good_result()
    changed["wall_s"] = 99.0
    with pytest.raises(OSError, match="disk full"):
        write_result(target, changed)
    assert target.read_text() == before
    assert os.listdir(target.parent) == ["quick.json"]


def test_read_rejects_garbage(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ResultSchemaError, match="not valid JSON"):
        read_result(tmp_path / "x.json")


def test_written_files_get_plain_permissions(tmp_path):
    import stat

    old = os.umask(0o022)
    try:
        path = write_result(tmp_path / "demo" / "quick.json", good_result())
        icml_io.atomic_write_with(tmp_path / "p.png", lambda tmp: open(tmp, "wb").close())
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "p.png").stat().st_mode) == 0o644


def test_committed_results_are_strict_json():
    """Committed results hold no bare NaN/Infinity (strict parsers reject them); non-finite
    numbers are written as null and read back as NaN."""
    import json

    from .conftest import ROOT

    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token}")

    for path in sorted((ROOT / "results").glob("*/*.json")):
        text = path.read_text(encoding="utf-8")
        json.loads(text, parse_constant=refuse)


def test_nan_round_trips_as_null(tmp_path):
    import json
    import math

    from icml26.common.results import dumps_result

    text = dumps_result({"estimate": float("nan"), "values": [1.0, float("inf")], "unit_values": [[0.5, float("nan")]]})
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["estimate"] is None and data["values"] == [1.0, None] and data["unit_values"] == [[0.5, None]]
    from icml26.common.results import _null_to_nan

    back = _null_to_nan(data)
    assert math.isnan(back["estimate"]) and math.isnan(back["values"][1]) and math.isnan(back["unit_values"][0][1])


def test_source_digest_names_the_installed_code(tmp_path):
    from icml26.common.repro import source_digest

    pkg = tmp_path / "icml26"
    (pkg / "demo").mkdir(parents=True)
    (pkg / "demo" / "experiment.py").write_text("A = 1\n")
    (pkg / "demo" / "README.md").write_text("prose\n")
    first = source_digest(pkg)
    (pkg / "demo" / "README.md").write_text("other prose\n")
    assert source_digest(pkg) == first  # prose does not decide numbers
    (pkg / "demo" / "experiment.py").write_text("A = 2\n")
    assert source_digest(pkg) != first


def test_unit_ids_per_metric():
    run = SeedRun({}, units={"items": {"a": {"x": [1, 0, 1], "pooled": [1, 1]}}},
                  unit_ids={"a.x": ["p", "q", "r"], "a.pooled": ["p+q", "r"]},
                  held_out={"a.x": {"train": ["s", "p"], "validation": []}})
    assert run.overlap() == {"a.x": {"train": 1, "validation": 0}}
    with pytest.raises(ValueError, match=r"has 2 ids but a\.x has 3"):
        SeedRun({}, units={"items": {"a": {"x": [1, 0, 1]}}}, unit_ids={"a.x": ["p", "q"]})
    with pytest.raises(ValueError, match="no per-unit values"):
        SeedRun({}, units={"items": {"a": {"x": [1, 0, 1]}}}, unit_ids={"a.y": ["p", "q", "r"]})


def test_a_killed_writers_temp_files_are_swept_by_the_next_write(tmp_path):
    """`kill -9` mid-write leaves `.name.XXXX.tmp`; the next write of that target removes it once it is stale."""
    import time

    target = tmp_path / "quick.json"
    old = tmp_path / ".quick.json.abc123.tmp"
    fresh = tmp_path / ".quick.json.def456.tmp"  # a writer still at work: too young to remove
    other = tmp_path / ".full.json.abc123.tmp"  # another target's: not this write's business
    plot_old = tmp_path / ".quick_a.abc123.png"
    for p in (old, fresh, other, plot_old):
        p.write_text("half")
    stale = time.time() - icml_io.STALE_TMP_S - 10
    for p in (old, other, plot_old):
        os.utime(p, (stale, stale))
    icml_io.atomic_write_text(target, "{}")
    assert target.read_text() == "{}"
    assert not old.exists() and fresh.exists() and other.exists()
    icml_io.atomic_write_with(tmp_path / "quick_a.png", lambda p: Path(p).write_bytes(b"png"))
    assert not plot_old.exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        ".full.json.abc123.tmp", ".quick.json.def456.tmp", "quick.json", "quick_a.png"]


def _same(a, b):
    """Equal, NaN equal to NaN."""
    import math

    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_read_results_nulls_in_one_pass_equal_the_two_pass_conversion(tmp_path):
    """read_result converts numeric nulls while parsing (object hook); it must equal _null_to_nan of the parse, on a
    hand-made document (nested lists, a null outside a numeric key, an object under a numeric key) and on every
    committed result."""
    import math

    from icml26.common.results import _nan_hook, _null_to_nan

    doc = ('{"estimate": null, "values": [1, null, [null, 2]], "note": null, "per_seed": [{"mean": null, "x": null}],'
           ' "arms": {"a": {"m": {"mean": null, "std": 0.5, "values": [null]}}}, "interval": null}')
    fast, slow = json.loads(doc, object_hook=_nan_hook), _null_to_nan(json.loads(doc))
    assert _same(fast, slow)
    assert math.isnan(fast["values"][2][0]) and fast["note"] is None and fast["per_seed"][0]["x"] is None
    assert math.isnan(fast["per_seed"][0]["mean"]) and math.isnan(fast["arms"]["a"]["m"]["values"][0])
    root = Path(__file__).resolve().parents[1] / "results"
    for path in sorted(root.glob("*/quick.json"))[:6]:
        text = path.read_text()
        assert _same(json.loads(text, object_hook=_nan_hook), _null_to_nan(json.loads(text))), path
