"""The unsafe-routes reproduction: the world, smoke run through the CLI, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("transformers")

from icml26.unsafe_moe.experiment import (
    EVAL_PREFIXES,
    HARMFUL,
    PRESETS,
    TRAIN_PREFIXES,
    keys,
    prompts,
    request_of,
    run,
)

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess

TINY = dataclasses.replace(PRESETS["smoke"], pretrain_steps=3, align_steps=2, n_eval=2, n_calib=2, n_candidates=2,
                           max_iters=1, rosais_masks=2, cache=False, layers=2, hidden=32, max_new_tokens=6)


def test_world_keeps_evaluation_prefixes_held_out():
    assert not set(TRAIN_PREFIXES) & set(EVAL_PREFIXES)
    items = prompts(EVAL_PREFIXES, HARMFUL)
    assert len(items) == 24 and {request_of(p) for p in items} == set(HARMFUL)
    assert keys(0) == keys(0) and keys(0) != keys(1) and all(len(k) == 4 for k in keys(0).values())
    with pytest.raises(ValueError, match="no known request"):
        request_of("how do i fly.")


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("unsafe_moe", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == {"fsour_asr", "vs_random_routes", "rosais_masking",
                                                 "rosais_top_vs_bottom", "defence_lowers_asr",
                                                 "defence_keeps_benign"}
    assert (tmp_path / "unsafe_moe" / "smoke_asr_rosais.png").is_file()
    assert 0.0 <= data["arms"]["fsour"]["asr"]["mean"] <= 1.0


def test_same_seed_same_numbers():
    strip = {"search_s"}

    def numbers(cfg):
        return {a: {k: v for k, v in m.items() if k not in strip} for a, m in run(cfg).metrics.items()}

    assert numbers(TINY) == numbers(TINY)


def test_bad_config():
    with pytest.raises(ValueError, match="families"):
        run(dataclasses.replace(TINY, families=("llama",)))
    with pytest.raises(ValueError, match="n_eval"):
        run(dataclasses.replace(TINY, n_eval=25))


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("unsafe_moe", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "unsafe_moe" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
