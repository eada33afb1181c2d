"""The RePO reproduction: smoke run through the CLI, the pairs' behaviour columns, per-prompt bookkeeping, the
tuning grid; quick run (slow)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("transformers")

from icml26.common.tiny_lm import AdditionChain, accuracy
from icml26.regret_po.experiment import (
    ARM_SPECS,
    ARMS,
    LAB_ROLES,
    PRESETS,
    REPO_VARIANTS,
    arm_config,
    chain_pools,
    climb,
    correctness,
    lab_models,
    preference_data,
    prompt_id,
    run,
    seed_prompts,
    sft_data,
)

from ..helpers import assert_matches_committed, reproduce_in_subprocess


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("regret_po", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == {
        "vs_rpo",
        "regret_labels",
        "nll_term",
        "no_nll",
        "vs_nll",
        "deterministic_variant",
        "behaviour_matters",
        "headroom",
    }
    stat = data["arms"]["repo_best"]["accuracy"]
    assert stat["unit"] == "prompts" and len(stat["unit_values"][0]) == PRESETS["smoke"].eval_prompts
    assert (tmp_path / "regret_po" / "smoke_tuned_accuracy.png").is_file()
    assert (tmp_path / "regret_po" / "smoke_learning_curves.png").is_file()
    # smoke scores one grid point per arm: every arm's choice is flagged as unbracketed, in the result
    notes = next(c for c in data["claims"] if c["id"] == "vs_rpo")["notes"]
    assert "Grid edges (automatic)" in str(notes)


def test_pairs_are_labelled_by_regret_and_carry_behaviour_logps():
    cfg = PRESETS["smoke"]
    tok, _, mu_s, mu_w = lab_models(cfg)
    data = preference_data(cfg, tok, mu_s, mu_w, seed_prompts(cfg)["pairs"][:40], seed=3)
    assert data["prompt"] and len(data["chosen_behavior_logps"]) == len(data["chosen"])
    for side in ("chosen", "rejected"):
        for c, b, ids, top in zip(
            data[side],
            data[f"{side}_behavior_logps"],
            data[f"{side}_behavior_topk_ids"],
            data[f"{side}_behavior_topk_logps"],
            strict=True,
        ):
            n = len(tok(c, add_special_tokens=False)["input_ids"]) + 1  # completion + EOS, TRL's layout
            assert len(b) == len(ids) == len(top) == n and all(v <= 0 for v in b)
            assert all(len(row) == cfg.top_k for row in ids)
            # the sampled token's log-prob never exceeds the generator's top-1
            assert all(v <= t[0] + 1e-5 for v, t in zip(b, top, strict=True))


def test_per_prompt_correctness_is_the_lab_accuracy():
    cfg = PRESETS["smoke"]
    tok, pi0, _, _ = lab_models(cfg)
    task = AdditionChain(cfg.terms, cfg.max_value)
    rng = np.random.default_rng(11)
    prompts = [task.sample(rng).prompt for _ in range(30)]
    per = correctness(pi0, tok, task, prompts)
    assert set(per) <= {0.0, 1.0} and len(per) == len(prompts)
    assert np.mean(per) == pytest.approx(accuracy(pi0, tok, task, prompts, max_new_tokens=16), abs=1e-12)


def test_every_arm_uses_the_same_budget_and_trainer_settings():
    cfg = PRESETS["full"]
    for arm in ARMS:
        a = arm_config(arm, cfg, 3e-4, 3.0, "/tmp/unused", draw=1)
        assert (a.max_steps, a.per_device_train_batch_size, a.learning_rate, a.seed, a.data_seed) == (
            cfg.steps,
            cfg.batch_size,
            3e-4,
            cfg.seed,
            1000 * cfg.seed + 1,
        )
        # constant learning rate: the checkpoint at step s is the run of s steps (the budget is chosen on them)
        assert getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type) == "constant"
        kind, variant, sft, beta, pooling = ARM_SPECS[arm]
        assert (a.loss_kind, a.sft_coef, a.topk, a.deterministic, a.nll_pooling) == (
            kind,
            sft,
            variant == "topk",
            variant == "det",
            pooling,
        )
        if kind == "repo":
            assert a.alpha == pytest.approx(3.0 * beta)
        elif kind != "nll":
            assert a.beta == pytest.approx(3.0 * beta)
    # RPO is TRL's ["sigmoid", "sft"] (token-pooled NLL); rpo_seq differs only in the pooling; dpo lacks the NLL
    assert ARM_SPECS["rpo"] == ("dpo", "", 1.0, 0.1, "token")
    assert ARM_SPECS["rpo_seq"] == ("dpo", "", 1.0, 0.1, "sequence")
    assert ARM_SPECS["dpo"][:2] == ARM_SPECS["rpo"][:2] and ARM_SPECS["dpo"][2] == 0.0
    assert arm_config("rpo", cfg, 1e-3, 1.0, "/tmp/unused", steps=7).max_steps == 7


def test_climb_brackets_the_choice_on_every_axis():
    """The hill climb stops only where the chosen point beats a scored neighbour on each side of every axis."""
    def f(ij):
        return -((ij[0] - 3) ** 2) - 2 * (ij[1] + 2) ** 2

    best, scores, notes = climb(f, 2, lambda ij: True, 50)
    assert best == (3, -2) and notes == []
    for axis in range(2):
        for step in (-1, 1):
            nb = tuple(c + step * (a == axis) for a, c in enumerate(best))
            assert nb in scores and scores[nb] < scores[best]
    # the optimum beyond a limit: the choice sits on the limit and says so
    best, _, notes = climb(f, 2, lambda ij: ij[0] <= 1, 50)
    assert best == (1, -2) and len(notes) == 1 and "axis 0" in notes[0]
    # too few points to bracket: stopped, with a note
    best, scores, notes = climb(f, 2, lambda ij: True, 3)
    assert len(scores) == 3 and notes and "stopped at 3 points" in notes[0]
    # a flat score keeps the centre (ties to the centre)
    assert climb(lambda ij: 0.0, 1, lambda ij: True, 10)[0] == (0,)


def test_every_arm_is_scored_on_the_same_prompts_in_the_same_order():
    # tuned on another seed's pairs and validation prompts (as full does), then retrained on this seed's pairs
    cfg = dataclasses.replace(PRESETS["smoke"], n_pairs=16, steps=2, eval_every=1, eval_prompts=12, val_prompts=6,
                              tune_seed=3)
    out = run(cfg)
    per = out.units["prompts"]
    assert set(per) == {"sft", "mu_strong", "mu_weak", *ARMS, "repo_best"}
    assert {len(m["accuracy"]) for m in per.values()} == {12}
    # the seed value the claims see is the mean of the arm's prompts
    for arm, m in per.items():
        assert out.metrics[arm]["accuracy"] == pytest.approx(float(np.mean(m["accuracy"])), abs=1e-12)
    # pairing by index: scoring the SFT start on the same prompts again gives the same vector
    tok, pi0, _, _ = lab_models(cfg)
    task = AdditionChain(cfg.terms, cfg.max_value)
    prompts = seed_prompts(cfg)["test"]
    assert correctness(pi0, tok, task, prompts) == per["sft"]["accuracy"]
    # every unit carries its id (the prompt's text hash), and none was trained or tuned on
    assert set(out.unit_ids) == set(out.units) == {"prompts"}
    assert out.unit_ids["prompts"] == [prompt_id(p) for p in prompts]
    assert set(out.held_out) == {"prompts"} and out.overlap() == {"prompts": {"train": 0, "validation": 0}}
    tuning_val = seed_prompts(dataclasses.replace(cfg, seed=3))["validation"]
    assert set(out.held_out["prompts"]["validation"]) == {prompt_id(p) for p in tuning_val}
    # the tuning scored validation-pool prompts only (never a test-pool chain)
    assert set(tuning_val) <= set(chain_pools(cfg)["validation"])
    assert out.series["tune_seed"] == 3
    # repo_best is one of the RePO variants, chosen on validation accuracy only
    chosen = out.series["repo_best"]
    assert chosen in REPO_VARIANTS and per["repo_best"] == per[chosen]
    assert out.metrics[chosen]["val_accuracy"] == max(out.metrics[a]["val_accuracy"] for a in REPO_VARIANTS)
    # every scored grid point is recorded; the chosen one has the best validation accuracy of its arm, its budget is
    # the best checkpoint of its learning curve, and every chosen value is in the metrics
    for arm in ARMS:
        rec = out.series["tuning"][arm]
        assert out.metrics[arm]["val_accuracy"] == max(p["val_accuracy"] for p in rec["points"])
        assert rec["val_accuracy"] == max(rec["curve"])
        assert out.metrics[arm]["steps"] == cfg.eval_every * (int(np.argmax(rec["curve"])) + 1)
        assert {k: out.metrics[arm][k] for k in ("lr", "beta_mult")} == {
            k: rec["chosen"][k] for k in ("lr", "beta_mult")
        }


@pytest.mark.slow
def test_quick_reproduces_the_committed_result(tmp_path):
    data = reproduce_in_subprocess("regret_po", tmp_path, mode="quick")
    # Same CPU: bit-identical (the run is deterministic). Another CPU: float32 SFT and AdamW steps sum in a
    # different order (SIMD width, BLAS kernels), which can flip a few greedy answers and sampled responses, and a
    # flipped validation tie can select another grid point; 0.05 is 15 of the 300 test prompts, 15 pairs about 4 %
    # of the ~350 pairs. The chosen learning rates, betas and budgets may move by a grid step, so they are not
    # compared.
    tol = {f"{arm}.pairs": 15.0 for arm in ("sft", *ARMS, "repo_best")}
    tol.update({f"{arm}.{m}": float("inf") for arm in (*ARMS, "repo_best")
                for m in ("lr", "beta_mult", "steps", "at_edge", "val_accuracy")})
    tol["repo_best.variant"] = float("inf")
    assert_matches_committed(data, atol=0.05, metrics=tol)


def test_chain_pools_partition_the_world():
    cfg = PRESETS["quick"]
    pools = chain_pools(cfg)
    sizes = {k: len(v) for k, v in pools.items()}
    assert sizes == {"test": cfg.test_pool, "validation": cfg.val_pool,
                     "train": (cfg.max_value + 1) ** cfg.terms - cfg.test_pool - cfg.val_pool}
    sets = {k: set(v) for k, v in pools.items()}
    assert sum(len(v) for v in sets.values()) == sum(sizes.values())  # distinct within and across pools
    # the pools are the lab's: every preset uses the same split (the lab models are shared)
    assert all(chain_pools(p) == pools for p in PRESETS.values())
    assert chain_pools(dataclasses.replace(cfg, seed=7)) == pools
    with pytest.raises(ValueError, match="test_pool"):
        chain_pools(dataclasses.replace(cfg, test_pool=900, val_pool=100))


@pytest.mark.parametrize("preset", ["quick", "full"])
def test_test_prompts_are_distinct_and_disjoint_from_training_and_validation(preset):
    cfg = PRESETS[preset]
    sft_prompts = {p for role in LAB_ROLES for p in sft_data(cfg, role)[0]}
    for seed in (0, 1, 100, 101):
        prompts = seed_prompts(dataclasses.replace(cfg, seed=seed))
        test, val, pairs = prompts["test"], prompts["validation"], prompts["pairs"]
        assert len(test) == len(set(test)) == cfg.eval_prompts
        assert len(val) == len(set(val)) == cfg.val_prompts and len(pairs) == cfg.n_pairs
        assert not set(test) & set(val)
        assert not set(test) & (set(pairs) | sft_prompts)
        assert not set(val) & (set(pairs) | sft_prompts)
    with pytest.raises(ValueError, match="eval_prompts"):
        seed_prompts(dataclasses.replace(cfg, eval_prompts=cfg.test_pool + 1))


def test_checkpoints_follow_the_budget_and_stop_early():
    """The learning-curve callback sees every eval_every-th step and ends the run when it asks to (early stopping)."""
    import datasets

    from icml26.regret_po.experiment import train_arm

    cfg = dataclasses.replace(PRESETS["smoke"], steps=6, eval_every=2, batch_size=2)
    tok, pi0, _, _ = lab_models(cfg)
    data = datasets.Dataset.from_dict({"prompt": ["1+2+3="] * 4, "chosen": ["1+2=3;3+3=6"] * 4,
                                       "rejected": ["1+2=4;4+3=7"] * 4})
    seen: list[int] = []
    train_arm("rpo", cfg, 1e-3, 1.0, tok, pi0, data, checkpoint=lambda step, model: seen.append(step) or False)
    assert seen == [2, 4, 6]
    seen.clear()
    train_arm("rpo", cfg, 1e-3, 1.0, tok, pi0, data, checkpoint=lambda step, model: seen.append(step) or step >= 4)
    assert seen == [2, 4]
