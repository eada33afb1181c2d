"""The result format: aggregation, schema, atomic writes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from icml26.common import io as icml_io
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
        "claims": [{"id": "c", "text": "t", "check": "method.acc >= 0.5", "paper": {"value": "1", "where": "T1",
                    "scale": "s"}, "ours": "method.acc = 0.85", "holds": True, "why": "w"}],
        "env": {"python": "3.11"}, "wall_s": 1.5, "created": "2026-11-30T00:00:00+00:00",
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


@pytest.mark.parametrize("metrics", [{}, {"a": {"x": "high"}}, {"a": {"x": True}}, {"a": [1.0]}])
def test_seedrun_rejects_bad_metrics(metrics):
    with pytest.raises(TypeError):
        SeedRun(metrics)


def test_validate_accepts_and_rejects():
    validate_result(good_result())
    for mutate, msg in [
        (lambda d: d.pop("env"), "missing keys"),
        (lambda d: d.update(mode="fast"), "mode must be"),
        (lambda d: d.update(seeds=[]), "seeds"),
        (lambda d: d["arms"]["method"]["acc"].update(values=[1.0]), "one value per seed"),
        (lambda d: d["arms"]["method"]["acc"].pop("std"), "exactly mean, std, values"),
        (lambda d: d["claims"][0].update(holds="yes"), "holds must be true or false"),
        (lambda d: d["claims"][0].pop("why"), "every claim needs keys"),
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
