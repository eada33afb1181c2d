"""Learning-rate grids bracket every arm's choice (issue 53): ``choose_lr`` grows the grid past an edge on the
1-3-10 ladder until a tried rate lies on each side of the choice (or its extensions run out, then says so);
``observe_groups`` feeds the prompt-conditioned law each group's rollouts before its cutoffs are drawn."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from icml26.ps_ppo import AdaptiveCutoff, StratifiedCutoff, UniformCutoff
from icml26.ps_ppo.experiment import PRESETS, _ladder_step, choose_lr, make_law, observe_groups
from icml26.registry import get_paper


def _peaked(at: float, calls: list[float]):
    """A validation score peaked at ``at`` (log scale); records each rate it is asked about."""

    def evaluate(lr):
        calls.append(lr)
        return -abs(math.log10(lr / at)), f"run at {lr:g}"

    return evaluate


def test_ladder_steps():
    assert _ladder_step(3e-4, up=True) == 1e-3 and _ladder_step(3e-4, up=False) == 1e-4
    assert _ladder_step(1e-4, up=False) == 3e-5 and _ladder_step(5e-5, up=False) == 3e-5
    assert _ladder_step(5e-5, up=True) == 1e-4 and _ladder_step(1e-5, up=False) == 3e-6


def test_interior_choice_needs_no_extension():
    calls: list[float] = []
    c = choose_lr((3e-5, 1e-4, 3e-4), _peaked(1e-4, calls), 2)
    assert (c.lr, c.grid, c.extensions, c.at_edge) == (1e-4, [3e-5, 1e-4, 3e-4], 0, False)
    assert calls == [3e-5, 1e-4, 3e-4] and c.artifact == "run at 0.0001"


@pytest.mark.parametrize(
    ("peak", "lr", "grid"),
    [
        (1e-5, 1e-5, [3e-6, 1e-5, 3e-5, 1e-4, 3e-4]),  # two steps down: the second brackets it
        (1.5e-3, 1e-3, [3e-5, 1e-4, 3e-4, 1e-3, 3e-3]),  # two steps up: 3e-3 scores below 1e-3
    ],
)
def test_edge_choice_extends_the_grid_until_bracketed(peak, lr, grid):
    calls: list[float] = []
    c = choose_lr((3e-5, 1e-4, 3e-4), _peaked(peak, calls), 2)
    assert (c.lr, c.grid, c.extensions, c.at_edge) == (lr, grid, 2, False)
    assert sorted(calls) == grid and len(calls) == len(set(calls))  # each rate trained once


def test_edge_left_after_the_extensions_is_flagged():
    c = choose_lr((1e-4, 3e-4), _peaked(1e-7, []), 1)
    assert (c.lr, c.grid, c.extensions, c.at_edge) == (3e-5, [3e-5, 1e-4, 3e-4], 1, True)
    record = c.record()
    assert record["at_edge"] and record["chosen"] == 3e-5 and record["scores"][0] == max(record["scores"])
    one = choose_lr((1e-4,), _peaked(1e-4, []), 0)
    assert one.at_edge and one.grid == [1e-4]  # a one-rate grid brackets nothing


def test_ties_keep_the_smaller_rate_and_a_flat_score_extends_down():
    c = choose_lr((1e-4, 3e-4), lambda lr: (0.5, None), 1)
    assert c.lr == 3e-5 and c.at_edge and c.grid == [3e-5, 1e-4, 3e-4]


def test_choose_lr_bad_input():
    with pytest.raises(ValueError, match="grid"):
        choose_lr((), lambda lr: (0.0, None), 1)
    with pytest.raises(ValueError, match="grid"):
        choose_lr((0.0, 1e-4), lambda lr: (0.0, None), 1)
    with pytest.raises(ValueError, match="max_extensions"):
        choose_lr((1e-4,), lambda lr: (0.0, None), -1)


def test_presets_bracket_and_tune_on_a_seed_of_their_own():
    card = get_paper("ps_ppo")
    for mode in ("quick", "full"):
        cfg = PRESETS[mode]
        assert len(cfg.lrs) >= 3 and cfg.lr_extensions >= 1
        assert cfg.lr_tuning_seed is None or cfg.lr_tuning_seed not in card.modes[mode].seeds
        assert "ps_ppo_adaptive" in cfg.arms


def test_observe_groups_feeds_each_groups_decision_point_to_the_prompt_conditioned_law():
    # completion ids (mask 1) of two groups of two rollouts: group "a" differs at its 2nd token, "b" at its 4th
    ids = torch.tensor([[9, 1, 2, 3, 4], [9, 1, 5, 3, 4], [9, 7, 7, 7, 1], [9, 7, 7, 7, 2]])
    comp = torch.tensor([[0, 1, 1, 1, 1]] * 4)
    batch = {"input_ids": ids, "completion_mask": comp}
    law = make_law("ps_ppo_adaptive")
    assert isinstance(law, StratifiedCutoff) and isinstance(law.base, AdaptiveCutoff)
    observe_groups(law, ["a", "a", "b", "b"], batch, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert law.base.decision == {"a": (2.0, 1), "b": (4.0, 1)}
    # the survival is the per-prompt mixture 0.5 uniform + 0.5 geometric(1 / d_x)
    s = law.survival(torch.tensor([4, 4]), 4, keys=["a", "b"]).double()
    t = torch.arange(4, dtype=torch.float64)
    for row, d in ((0, 2.0), (1, 4.0)):
        expected = 0.5 * (4 - t) / 4 + 0.5 * (1 - 1 / d) ** t
        torch.testing.assert_close(s[row], expected, rtol=1e-6, atol=1e-7)
    # a group without a correct-incorrect pair keeps the default; laws without prompt conditioning are left alone
    observe_groups(law, ["c", "c", "c", "c"], batch, torch.zeros(4))
    assert "c" not in law.base.decision
    observe_groups(StratifiedCutoff(UniformCutoff()), ["a"] * 4, batch, torch.ones(4))
    with pytest.raises(ValueError, match="keys"):
        observe_groups(law, ["a"], batch, torch.ones(4))


def test_a_tuning_seed_chooses_once_on_its_own_prompts(monkeypatch):
    """With ``lr_tuning_seed`` the rates are chosen on that seed's prompts (never the evaluated seed's), once for
    all evaluated seeds; its validation prompts are held out of every evaluated seed's test prompts."""
    import dataclasses

    from icml26.common.tiny_lm import AdditionChain
    from icml26.ps_ppo import experiment as E

    seen = []

    def fake_tune(cfg):
        seen.append((cfg.seed, cfg.lr_tuning_seed))
        return {"grpo": "choice"}

    monkeypatch.setattr(E, "tune_arms", fake_tune)
    monkeypatch.setattr(E, "_TUNED", {})
    base = dataclasses.replace(PRESETS["smoke"], lr_tuning_seed=77, val_prompts=6, eval_prompts=5)
    for seed in (3, 4):
        assert E.tuned_on_tuning_seed(dataclasses.replace(base, seed=seed)) == {"grpo": "choice"}
    assert seen == [(77, None)]
    task = AdditionChain(base.terms, 9)
    cfg = dataclasses.replace(base, seed=3)
    sets = E.prompt_sets(cfg, task)
    assert sets.tuning == E.validation_prompts(cfg, task, 77) and len(sets.tuning) == 6
    assert sets.validation == E.validation_prompts(cfg, task, 3) != sets.tuning
    _, held = E.unit_ids(cfg, task, sets)
    assert {E.prompt_id(q) for q in sets.tuning} <= set(held["prompts"]["validation"])
    assert E.prompt_sets(dataclasses.replace(cfg, lr_tuning_seed=None), task).tuning == []
