"""The learning-rate choice (issue #54): per arm and per depth, the mean over validation draws, a bracketed grid.

Training is stubbed out: ``train_arm`` returns a token naming what it would have trained and ``_scores`` scores
it by a hand-written table, so each test states which rate must win and how many runs it may cost. The cache is
real (a temporary ``ICML26_CACHE``), so a cache key that forgets the depth or the draw shows as missing runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("transformers")

from icml26.moda import experiment
from icml26.moda.experiment import ARMS, HEADLINE, PRESETS

GRID = (1e-3, 3e-3, 9e-3, 2.7e-2)
CFG = dataclasses.replace(PRESETS["smoke"], lr_grid=GRID, n_val=8, val_draws=2, lr_extend=1, depths=(2,),
                          depth_arms=("none", "moda"))


def stub_training(monkeypatch, tmp_path, accuracy):
    """Replace training and scoring: ``accuracy(arm, lr, layers, draw)`` is a run's validation accuracy. Returns
    the list of ``(arm, lr, layers, seed)`` of every training run and the list of the validation render seeds."""
    monkeypatch.setenv("ICML26_CACHE", str(tmp_path))
    trained: list[tuple[str, float, int, int]] = []
    rendered: list[int] = []

    def fake_train(arm, cfg, lr, seed, layers=None, record=None):
        layers = cfg.layers if layers is None else layers
        trained.append((arm, lr, layers, seed))
        return (arm, lr, layers, seed - experiment.validation_seed(cfg, 0)), None, None

    def fake_scores(model, tok, scenes, attrs, items, seed):
        rendered.append(seed)
        return np.full(len(items), accuracy(*model))

    monkeypatch.setattr(experiment, "train_arm", fake_train)
    monkeypatch.setattr(experiment, "_scores", fake_scores)
    return trained, rendered


def peak(best: float):
    """Accuracy falling off with the distance (in grid steps) from ``best``."""
    return lambda lr: 0.9 - 0.1 * abs(np.log(lr / best) / np.log(3))


def test_each_arm_is_trained_once_per_rate_draw_and_depth_and_the_depth_has_its_own_choice(monkeypatch, tmp_path):
    """Depth 1 peaks at 9e-3, depth 2 at 3e-3 (plain LLaVA at two layers wants a smaller rate, issue #54): the
    sweep's arms get 3e-3 from depth-2 runs, the main arms 9e-3; each (arm, rate, depth, draw) trains once, the
    draws on seeds 20000 and 20001, and a second call reads the cache."""
    trained, rendered = stub_training(
        monkeypatch, tmp_path, lambda arm, lr, layers, draw: peak(9e-3 if layers == 1 else 3e-3)(lr))
    choice = experiment.tune_learning_rates(CFG)
    assert set(choice) == {*ARMS, "none_l2", "moda_l2"}
    assert {name: c["lr"] for name, c in choice.items()} == pytest.approx(
        {**dict.fromkeys(ARMS, 9e-3), "none_l2": 3e-3, "moda_l2": 3e-3})
    assert not any(c["at_edge"] for c in choice.values())
    want = [(arm, lr, 1, 20_000 + d) for arm in ARMS for lr in GRID for d in (0, 1)]
    want += [(arm, lr, 2, 20_000 + d) for arm in ("none", "moda") for lr in GRID for d in (0, 1)]
    assert sorted(trained) == sorted(want)
    assert set(rendered) == {20_000}  # every draw scores the same rendered validation images
    assert experiment.tune_learning_rates(CFG) == choice and len(trained) == len(want)  # cached
    more = dataclasses.replace(CFG, val_draws=3)
    experiment.tune_learning_rates(more)
    assert {(seed, layers) for _, _, layers, seed in trained[len(want):]} == {(20_002, 1), (20_002, 2)}


def test_the_mean_over_draws_decides_not_the_first_draw(monkeypatch, tmp_path):
    """Draw 0 alone would pick 3e-3; the mean over both draws picks 9e-3, and the record keeps both draws."""
    table = {0: {1e-3: 0.5, 3e-3: 0.9, 9e-3: 0.6, 2.7e-2: 0.4}, 1: {1e-3: 0.5, 3e-3: 0.3, 9e-3: 0.9, 2.7e-2: 0.4}}
    stub_training(monkeypatch, tmp_path, lambda arm, lr, layers, draw: table[draw][lr])
    got = experiment.tune_arm(CFG, "moda")
    assert got["lr"] == pytest.approx(9e-3)
    assert got["val_accuracy"] == pytest.approx(0.75)
    assert got["val_accuracy_draws"] == pytest.approx([0.6, 0.9])
    assert got["scores"] == pytest.approx([0.5, 0.6, 0.75, 0.4])
    # a tie in draw 0 is broken by draw 1, not by the grid's order
    tie = {0: {1e-3: 0.5, 3e-3: 0.8, 9e-3: 0.8, 2.7e-2: 0.4}, 1: {1e-3: 0.5, 3e-3: 0.6, 9e-3: 0.7, 2.7e-2: 0.4}}
    stub_training(monkeypatch, tmp_path / "tie", lambda arm, lr, layers, draw: tie[draw][lr])
    assert experiment.tune_arm(CFG, "none")["lr"] == pytest.approx(9e-3)


def test_an_edge_choice_extends_the_grid_once_and_is_flagged(monkeypatch, tmp_path):
    """Accuracy rising with the rate: the top of the grid wins, one rate past it (x3) is tried on both draws and
    wins too, so the choice is still on the edge; ``lr_extend=0`` tries nothing more."""
    trained, _ = stub_training(monkeypatch, tmp_path, lambda arm, lr, layers, draw: min(1.0, 10 * lr))
    got = experiment.tune_arm(CFG, "moda")
    assert got["lr"] == pytest.approx(8.1e-2) and got["at_edge"]
    assert got["grid"] == pytest.approx([*GRID, 8.1e-2])
    assert sorted(lr for _, lr, _, _ in trained) == pytest.approx(sorted([*GRID, 8.1e-2] * 2))
    assert experiment.tuning_metrics(got)["lr_at_edge"] == 1.0
    stub_training(monkeypatch, tmp_path / "fixed", lambda arm, lr, layers, draw: min(1.0, 10 * lr))
    fixed = experiment.tune_arm(dataclasses.replace(CFG, lr_extend=0), "moda")
    assert fixed["lr"] == pytest.approx(2.7e-2) and fixed["at_edge"] and len(fixed["grid"]) == len(GRID)


def test_run_trains_the_sweep_at_its_own_rate_and_records_every_choice(monkeypatch, tmp_path):
    """``run``: the test seed's models train at the chosen rates, the depth-2 arms at depth 2's; every choice is in
    the metrics (rate, mean and per-draw validation accuracy, edge flag) and the edge choice (moda at depth 1) is
    noted on the headline claim."""
    def accuracy(arm, lr, layers, draw):
        if layers == 2:
            return peak(3e-3)(lr)
        return min(1.0, 10 * lr) if arm == "moda" else peak(9e-3)(lr) + 0.01 * draw

    stub_training(monkeypatch, tmp_path, accuracy)
    trained: list[tuple[str, float, int]] = []

    def fake_train(arm, cfg, lr, seed, layers=None, record=None):
        trained.append((arm, lr, cfg.layers if layers is None else layers))
        return None, None, None

    def fake_evaluate(model, tok, cfg, data, seed):
        ent = np.array([it.entangled for it in data.items])
        return {"accuracy": np.ones(len(data.items)), "entangled_accuracy": np.ones(int(ent.sum())),
                "pair_accuracy": np.ones(len(data.pair_items) // 2)}

    cfg = dataclasses.replace(CFG, arms=("none", "moda"), n_test=8, n_pairs=2)
    experiment.tune_learning_rates(cfg)  # validation runs (stubbed above), now cached
    monkeypatch.setattr(experiment, "train_arm", fake_train)
    monkeypatch.setattr(experiment, "evaluate", fake_evaluate)
    monkeypatch.setattr(experiment, "toy_flops", lambda model, tok, cfg: 1.0)
    monkeypatch.setattr(experiment, "probe_outcomes", lambda model, cfg, data, seed: np.ones(len(data.items)))
    out = experiment.run(cfg)
    assert len(trained) == 4
    assert {(arm, layers): lr for arm, lr, layers in trained} == pytest.approx(
        {("none", 1): 9e-3, ("moda", 1): 8.1e-2, ("none", 2): 3e-3, ("moda", 2): 3e-3})
    assert out.metrics["none"]["lr"] == pytest.approx(9e-3) and out.metrics["moda_l2"]["lr"] == pytest.approx(3e-3)
    assert out.metrics["none"]["val_accuracy_draw0"] == pytest.approx(0.9)
    assert out.metrics["none"]["val_accuracy_draw1"] == pytest.approx(0.91)
    assert out.metrics["none"]["val_accuracy"] == pytest.approx(0.905)
    assert {name: out.metrics[name]["lr_at_edge"] for name in ("none", "moda", "none_l2", "moda_l2")} == {
        "none": 0.0, "moda": 1.0, "none_l2": 0.0, "moda_l2": 0.0}
    assert "moda (0.081 of" in out.notes[HEADLINE] and "none" not in out.notes[HEADLINE]
    assert {"none_l2", "moda_l2"} <= set(out.units["items"])


@pytest.mark.parametrize("field, bad", [("val_draws", 0), ("val_draws", -1), ("val_draws", 1.5),
                                        ("val_draws", True), ("lr_extend", -1), ("lr_extend", 0.5),
                                        ("lr_grid", (3e-3,)), ("lr_grid", (3e-3, 1e-3)), ("lr_grid", (0.0, 1e-3))])
def test_bad_tuning_settings_are_refused_naming_the_field(field, bad):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(CFG, **{field: bad})
