"""Verdicts v3: every test patch carries an id (its photograph and position) and none is a train patch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from icml26.vq_rank.data import _grey_images, patch_ids, patches, positions
from icml26.vq_rank.experiment import PRESETS, run


def test_a_tiny_run_carries_ids_for_every_unit_and_no_test_patch_was_trained_on():
    cfg = dataclasses.replace(PRESETS["smoke"], steps=3, arms=("mean", "simvq"), n_train=128, n_test=40)
    out = run(cfg)
    assert set(out.unit_ids) == set(out.units) == set(out.held_out) == {"patches"}
    assert {len(v) for m in out.units["patches"].values() for v in m.values()} == {len(out.unit_ids["patches"])}
    assert len(out.held_out["patches"]["train"]) == cfg.n_train
    assert out.overlap() == {"patches": {"train": 0, "validation": 0}}


@pytest.mark.parametrize("seed", [0, 1, 2, 100, 101, 102])
def test_ids_name_the_patches_cut_and_test_is_disjoint_from_train(seed):
    tr_ids, te_ids = patch_ids(seed, n_train=8000, n_test=500)
    assert not set(tr_ids) & set(te_ids)
    tr, te = positions(seed, n_train=8000, n_test=500)
    # the same position is the same patch; train and test never share a pixel column
    assert max(c for _, _, c in tr) + 16 <= min(c for _, _, c in te)
    X_tr, X_te = patches(seed, n_train=8000, n_test=500, normalize=False)
    images = _grey_images()
    for i in (0, 250, 499):
        k, t, c = te[i]
        assert np.array_equal(X_te[i, 0], images[k][t : t + 16, c : c + 16])
        assert te_ids[i] == f"{k}@{t},{c}/16"
    k, t, c = tr[-1]
    assert np.array_equal(X_tr[-1, 0], images[k][t : t + 16, c : c + 16])


def test_the_same_position_in_two_seeds_is_the_same_unit():
    a, b = set(patch_ids(0, 10, 4000)[1]), set(patch_ids(1, 10, 4000)[1])
    assert a & b  # 4000 draws from about 66,000 positions per photograph: some repeat across seeds
