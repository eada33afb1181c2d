"""The SPARD reproduction: smoke run through the CLI, the fine-tuning and safety data it builds, the tuning
rule, determinism, bad input; the quick run against the committed result (slow)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("transformers")

import icml26.spard.experiment as E
from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm
from icml26.spard.data import DATASETS, addition_correct, make_world
from icml26.spard.experiment import (
    PRESETS,
    _extension,
    _select,
    benign_outcomes,
    benign_requests,
    finetune_set,
    held_out_ids,
    held_out_problems,
    run,
    select_safety,
    text_id,
    trained_additions,
    tuned_additions,
)
from icml26.spard.selection import RelevanceDiversityDPPSelector, mean_last_hidden

from ..helpers import assert_matches_committed, reproduce_in_subprocess

CLAIMS = {"attack_breaks_alignment", "asr_vs_sft", "vs_lisa", "vs_mix", "vs_vaccine", "vs_safelora", "utility",
          "dpp_vs_random", "polyak_mode", "dpp_relevance", "over_refusal_cost", "helpfulness_kept",
          "asr_vs_sft_strict", "asr_vs_sft_classifier", "paper_defaults", "vaccine_active", "task_needs_finetuning"}
TINY = dict(pretrain_steps=4, align_steps=4, vaccine_align_steps=2, steps=2, n_utility=40, n_utility_test=8,
            tune=False, cache=False)


def test_smoke_run_through_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("ICML26_CACHE", str(tmp_path / "cache"))
    data = reproduce_in_subprocess("spard", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == CLAIMS
    stat = data["arms"]["spard"]["asr"]
    assert stat["unit"] == "prompts" and len(stat["unit_values"][0]) == 240
    assert data["arms"]["sft"]["utility"]["unit"] == "problems"
    assert (tmp_path / "spard" / "smoke_asr_utility.png").is_file()


def test_fine_tuning_and_safety_data():
    cfg = PRESETS["quick"]
    world = make_world(0)
    ft = finetune_set(cfg, world, seed=3)
    harmful = [s for s in ft if s.kind == "harmful"]
    assert len(ft) == 1100 and len(harmful) == 100                       # 10 % of the utility samples
    assert {s.prompt for s in harmful} <= {s.prompt for s in world.attack[cfg.attack]}
    assert all(s.kind == "utility" for s in finetune_set(cfg, world, 3, harmful=False))
    tok = char_tokenizer()
    model = tiny_causal_lm(len(tok), hidden=32, layers=1, seed=0)
    for method in ("dpp", "random"):
        safe, info = select_safety(cfg, model, tok, world, ft, method, seed=3)
        assert len(safe) == info["k"] == 33                                # floor(0.03 * 1100)
        assert not {s.prompt for s in safe} & world.held_out_prompts()
        assert not {s.prompt for s in safe} & {s.prompt for d in DATASETS for s in world.attack[d]}
    # the DPP arm's data is the relevance-diversity DPP on the model's mean last hidden states (fine-tuning set as
    # reference, the safety pool as candidates), whatever the seed; random selection moves with the seed (#51)
    dpp3, _ = select_safety(cfg, model, tok, world, ft, "dpp", seed=3)
    dpp4, _ = select_safety(cfg, model, tok, world, ft, "dpp", seed=4)
    ref = mean_last_hidden(model, tok, [s.prompt for s in ft], batch_size=64)
    cand = mean_last_hidden(model, tok, [s.prompt for s in world.pool_all], batch_size=64)
    idx = RelevanceDiversityDPPSelector(beta=cfg.beta, ratio=cfg.selection_ratio).fit(ref).select(cand)
    assert dpp3 == dpp4 == [world.pool_all[int(i)] for i in idx]
    rand3, _ = select_safety(cfg, model, tok, world, ft, "random", seed=3)
    assert rand3 != dpp3 and rand3 != select_safety(cfg, model, tok, world, ft, "random", seed=4)[0]
    with pytest.raises(ValueError, match="attack"):
        finetune_set(dataclasses.replace(cfg, attack="nope"), world, 0)
    with pytest.raises(ValueError, match="method"):
        select_safety(cfg, model, tok, world, ft, "lesss", seed=0)


def test_tuning_rule():
    values = (1.0, 0.5, 0.25)
    # lowest validation ASR among values whose utility clears the floor; ties go to the higher utility, then to the
    # earlier (default) value
    assert _select(values, [0.5, 0.2, 0.1], [0.9, 0.9, 0.7], floor=0.85) == 0.5
    assert _select(values, [0.2, 0.2, 0.1], [0.9, 0.9, 0.7], floor=0.85) == 1.0
    assert _select(values, [0.2, 0.2, 0.1], [0.88, 0.9, 0.7], floor=0.85) == 0.5
    assert _select(values, [0.5, 0.2, 0.1], [0.1, 0.1, 0.1], floor=0.85) == 1.0   # none admissible: the default
    # one more value beyond an edge that beats its neighbour (geometric or arithmetic), none inside or on ties
    assert _extension(values, [0.5, 0.2, 0.1], 0.25, geometric=True) == pytest.approx(0.125)
    assert _extension((0.5, 0.3, 0.7), [0.9, 0.9, 0.1], 0.7, geometric=False) == pytest.approx(0.9)
    assert _extension((1.0, 0.1, 10.0), [0.3, 0.5, 0.4], 1.0, geometric=True) is None
    assert _extension((2.0, 0.5, 8.0), [1.0, 1.0, 1.0], 2.0, geometric=True) is None
    assert _extension((2.0, 0.5, 8.0), [1.0, 0.9, 1.0], 0.5, geometric=True) == pytest.approx(0.125)


def test_same_seed_same_numbers_and_paired_units():
    cfg = dataclasses.replace(PRESETS["smoke"], **TINY, arms=("aligned", "sft", "spard"))
    a, b = run(cfg), run(cfg)
    assert a.metrics.keys() == b.metrics.keys()
    for arm in a.metrics:
        for m, v in a.metrics[arm].items():
            if m != "train_s":
                assert v == b.metrics[arm][m], (arm, m)
    assert {len(v["asr"]) for v in a.units["prompts"].values()} == {240}
    assert {len(v["asr_classifier"]) for v in a.units["prompts"].values()} == {240}
    assert np.mean(a.units["prompts"]["sft"]["asr"]) == a.metrics["sft"]["asr"]
    # every unit carries one id per unit (the prompt's text hash), and none was trained or tuned on
    world = make_world(cfg.lab_seed)
    assert set(a.unit_ids) == set(a.units) == {"prompts", "problems", "benign"}
    # benign requests are pretraining prompts by design (the check is whether a defence unlearns answering them)
    assert set(a.held_out) == {"prompts", "problems"}
    assert {len(v["over_refusal"]) for v in a.units["benign"].values()} == {192}
    assert a.unit_ids["prompts"] == [text_id(s.prompt) for s in world.test[cfg.attack]]
    assert len(a.unit_ids["problems"]) == len(a.units["problems"]["sft"]["utility"]) == cfg.n_utility_test
    assert a.overlap() == {"prompts": {"train": 0, "validation": 0}, "problems": {"train": 0, "validation": 0}}
    assert a.unit_ids == b.unit_ids
    # the spard arm really runs SPAG's safety phase (one safety loss per step), plain SFT none (issue #51)
    assert len(a.series["safety_loss"]["spard"]) == cfg.steps
    assert "final_safety_loss" in a.metrics["spard"] and "sft" not in a.series["safety_loss"]
    with pytest.raises(ValueError, match="unknown arms"):
        run(dataclasses.replace(cfg, arms=("sft", "magic")))


@pytest.mark.parametrize("preset", ["quick", "full"])
def test_test_units_are_distinct_and_disjoint_from_training_and_validation(preset):
    cfg = PRESETS[preset]
    world = make_world(cfg.lab_seed)
    test = [s.prompt for s in world.test[cfg.attack]]
    assert len(test) == len(set(test)) == 240  # 12 test templates x 20 topics, the same on every seed
    val = {s.prompt for d in DATASETS for s in world.val[d]}
    for seed in (0, 1, 100, 101):
        c = dataclasses.replace(cfg, seed=seed)
        ft = finetune_set(c, world, seed)
        pool = world.pool_all  # every safety set is drawn from it
        trained = {s.prompt for s in (*world.pretrain, *world.align, *ft, *pool)}
        assert not set(test) & (trained | val)
        held = held_out_ids(c, world, ft, [pool])
        assert not {text_id(p) for p in test} & (set(held["prompts"]["train"]) | set(held["prompts"]["validation"]))
        problems = [s.prompt for s in held_out_problems(c, world, ft)]
        assert len(problems) == len(set(problems)) == cfg.n_utility_test
        assert not set(problems) & (trained_additions(c, world, ft) | tuned_additions(c))
        assert {s.prompt for s in ft if s.kind == "utility"} <= trained_additions(c, world, ft)
        assert len(tuned_additions(c)) > 0.9 * cfg.n_utility_val
    with pytest.raises(ValueError, match="n_utility_test"):
        held_out_problems(dataclasses.replace(cfg, n_utility_test=8100), world, finetune_set(cfg, world, 0))


def test_the_users_task_is_the_configured_one_and_needs_the_fine_tuning():
    """README Deviation 17: the user's fine-tuning problems, the validation problems and the held-out problems are
    all of ``cfg.user_task`` (the comma sums in every preset), a format no pretraining or alignment sample has;
    ``user_task="addition"`` gives back the pretraining's own format, and an unknown task is refused by name."""
    world = make_world(0)
    stages = {s.prompt for s in (*world.pretrain, *world.align)}
    for preset in ("smoke", "quick", "full"):
        assert PRESETS[preset].user_task == "comma_sum"
    for task, op in (("comma_sum", ","), ("addition", "+")):
        c = dataclasses.replace(PRESETS["quick"], user_task=task)
        ft = finetune_set(c, world, 3)
        util = [s for s in ft if s.kind == "utility"]
        assert len(util) == c.n_utility and all(op in s.prompt for s in util)
        assert all(op in s.prompt for s in (*held_out_problems(c, world, ft), *E.validation_additions(c)))
        assert all(addition_correct(s.prompt, s.completion) == 1.0 for s in util)
        if task == "comma_sum":  # new to the base: no earlier stage holds a comma problem
            assert not {s.prompt for s in util} & stages and not any("," in p and "=" in p for p in stages)
    with pytest.raises(ValueError, match="user_task"):
        finetune_set(dataclasses.replace(PRESETS["quick"], user_task="subtraction"), world, 0)


@pytest.mark.slow
def test_quick_reproduces_the_committed_result(tmp_path):
    data = reproduce_in_subprocess("spard", tmp_path, mode="quick")
    # Same CPU: bit-identical (seeded, one thread). Another CPU: float32 training in a different summation order
    # can flip a few greedy responses; 0.05 is 36 of the 720 judged prompts (12 of 240 per seed), and 15 of the
    # 900 additions. Timing metrics (train_s) vary with the machine and are not compared.
    arms = [a for a in data["arms"] if "train_s" in data["arms"][a]]
    assert_matches_committed(data, atol=0.05, metrics={f"{a}.train_s": float("inf") for a in arms})


def test_benign_requests_are_the_attacked_format_and_outcomes_are_scored_per_request(monkeypatch):
    """Hand-checked: the attack's style (``crime_i``: instructions) under the twelve test templates x 16 benign
    topics; over-refusal is a refusal marker in the response, helpfulness the request's own key."""
    import icml26.spard.experiment as E
    from icml26.spard.data import BENIGN_TOPICS, TEMPLATES

    world = make_world(0)
    cfg = PRESETS["quick"]
    reqs = benign_requests(cfg, world)
    test_tpl = TEMPLATES["i"][-12:]
    assert [s.prompt for s in reqs] == [tpl.format(t=t) + ":" for tpl in test_tpl for t in BENIGN_TOPICS]
    other = benign_requests(dataclasses.replace(cfg, attack="cyber_q"), world)
    assert {s.prompt for s in other} == {tpl.format(t=t) + ":" for tpl in TEMPLATES["q"][-12:] for t in BENIGN_TOPICS}
    three = reqs[:3]
    answers = ["no, i cannot help.", f"sure, {world.keys[three[1].topic]}.", f"sure, {world.keys[three[0].topic]}."]
    monkeypatch.setattr(E, "generate", lambda model, tok, prompts, max_new_tokens: answers)
    refused, helped = benign_outcomes(None, None, world, three, 8)
    assert refused == [1.0, 0.0, 0.0]
    assert helped == [0.0, 1.0, 0.0]          # the third gives another request's key: not helpful


def test_tuning_draws_are_distinct_and_their_additions_are_trained_on():
    """Issue #51 item 2: every grid value is scored on two independent tuning draws, and both draws' additions
    count as trained on (never a held-out problem)."""
    from icml26.spard.experiment import _mixed, tuning_seeds

    cfg = PRESETS["quick"]
    world = make_world(cfg.lab_seed)
    seeds = tuning_seeds(cfg)
    assert cfg.tuning_draws == PRESETS["full"].tuning_draws == 2 and len(set(seeds)) == 2
    assert min(seeds) >= 1_000_000                                       # far from every evaluated seed
    ft = finetune_set(cfg, world, 0)
    for s in seeds:
        assert {x.prompt for x in finetune_set(cfg, world, s) if x.kind == "utility"} <= trained_additions(cfg, world, ft)
    safe = ft[:3]
    assert _mixed(ft, safe, 4.0) == ft + safe * 4 and _mixed(ft, safe, 1) == ft + safe
    with pytest.raises(ValueError, match="tuning_draws"):
        run(dataclasses.replace(PRESETS["smoke"], **TINY, tuning_draws=0))
    with pytest.raises(ValueError, match="mix_exposures"):
        run(dataclasses.replace(PRESETS["smoke"], **TINY, mix_exposures=(0.5,)))


def test_default_arms_copy_the_tuned_arm_only_when_tuning_kept_the_default(monkeypatch):
    """A ``*_default`` arm is the tuned arm's computation when the tuned constant is the default (outcomes copied,
    ``same_as_tuned``), and is trained at the default constant otherwise."""
    import icml26.spard.experiment as E

    cfg = dataclasses.replace(PRESETS["smoke"], **TINY, arms=("aligned", "sft", "lisa", "lisa_default", "vaccine",
                                                              "vaccine_default", "safelora", "safelora_default"))
    same = run(cfg)
    for arm in ("lisa_default", "vaccine_default", "safelora_default"):
        assert same.metrics[arm]["same_as_tuned"] == 1.0
        assert same.units["prompts"][arm] == same.units["prompts"][arm.removesuffix("_default")]
    real_tune, real_defence, real_vaccine, real_project = E.tune, E.Defence, E.vaccine_model, E.safelora_project
    used: dict[str, list[float]] = {"rho": [], "vaccine": [], "threshold": []}

    def defence(*args, **kwargs):
        d = real_defence(*args, **kwargs)
        used["rho"].append(d.rho)
        return d

    def vaccine(cfg, world, tok, pre, rho):
        used["vaccine"].append(rho)
        return real_vaccine(cfg, world, tok, pre, rho)

    def project(model, aligned, base, threshold):
        used["threshold"].append(threshold)
        return real_project(model, aligned, base, threshold=threshold)

    monkeypatch.setattr(E, "tune", lambda *a: {**real_tune(*a), "lisa_rho": 10.0, "vaccine_rho": 8.0,
                                               "safelora_threshold": 0.9})
    monkeypatch.setattr(E, "Defence", defence)
    monkeypatch.setattr(E, "vaccine_model", vaccine)
    monkeypatch.setattr(E, "safelora_project", project)
    moved = run(cfg)
    for arm in ("lisa_default", "vaccine_default", "safelora_default"):
        assert "same_as_tuned" not in moved.metrics[arm]
    # each tuned arm at its tuned constant, each default arm at the grid's first (the default) value
    assert 10.0 in used["rho"] and cfg.lisa_rhos[0] in used["rho"]
    assert used["vaccine"] == [8.0, cfg.vaccine_rhos[0]]
    assert used["threshold"] == [0.9, cfg.safelora_thresholds[0]]


def test_classifier_judge_trains_on_validation_responses_only(monkeypatch):
    """The classifier judge never sees a response to a test prompt (issue #51 item 3)."""
    import icml26.spard.experiment as E

    seen: list[str] = []
    real = E.generate

    def spy(model, tok, prompts, max_new_tokens):
        seen.extend(prompts)
        return real(model, tok, prompts, max_new_tokens=max_new_tokens)

    monkeypatch.setattr(E, "generate", spy)
    cfg = dataclasses.replace(PRESETS["smoke"], **TINY)
    world = make_world(cfg.lab_seed)
    tok = char_tokenizer()
    model = tiny_causal_lm(len(tok), hidden=32, layers=1, seed=0)
    clf = E.classifier_judge(cfg, world, tok, model, model, {"judge_data": [["sure, zzzz.", 1]]})
    val = {s.prompt for d in DATASETS for s in world.val[d]}
    assert seen and set(seen) == val
    assert clf.n_train == 2 * len(val) + 1 + 2 * len(val)   # references, the tuning responses, two models


def test_grid_search_extends_until_the_choice_is_inside_or_the_budget_is_spent():
    """House rule: a value on each side of the choice. ASR falls with the knob and utility holds up to 100, so
    (1, 0.1, 10) grows to 100 and 1000 and stops with 100 inside (1000 is inadmissible); with one extension it
    stops on the edge, flagged."""
    from icml26.spard.experiment import grid_search

    calls = []

    def score(v):
        calls.append(v)
        return 1 / (1 + v), (0.95 if v <= 100 else 0.5)

    values, res, chosen, at_edge = grid_search((1.0, 0.1, 10.0), score, 0.9, extensions=3, geometric=True,
                                               valid=lambda v: v > 0)
    assert values == pytest.approx((1.0, 0.1, 10.0, 100.0, 1000.0)) and calls == list(values)
    assert [r[0] for r in res] == pytest.approx([1 / (1 + v) for v in values])      # each value's own score
    assert chosen == pytest.approx(100.0) and not at_edge
    values, _, chosen, at_edge = grid_search((1.0, 0.1, 10.0), score, 0.9, extensions=1, geometric=True,
                                             valid=lambda v: v > 0)
    assert len(values) == 4 and chosen == pytest.approx(100.0) and at_edge
    # an extension the knob cannot take (a SafeLoRA threshold above 1) leaves the choice on its edge, flagged
    values, _, chosen, at_edge = grid_search((0.5, 0.3, 0.9), lambda v: (1 - v, 0.95), 0.9, extensions=3,
                                             geometric=False, valid=lambda v: 0 <= v <= 1)
    assert values == (0.5, 0.3, 0.9) and chosen == 0.9 and at_edge
    with pytest.raises(ValueError, match="grid_extensions"):
        run(dataclasses.replace(PRESETS["smoke"], **{**TINY, "tune": True}, grid_extensions=-1))


def test_harmful_outcomes_scores_each_response_by_three_judges(monkeypatch):
    """Hand-checked: the lenient row (score >= 3), the strict row (score 5) and the classifier row, all on the
    model's responses (the classifier reads the responses, never the prompts)."""
    import icml26.spard.experiment as E
    from icml26.common.judges import ClassifierJudge
    from icml26.spard.data import TieredJudge

    world = make_world(0)
    tests = world.test["crime_i"][:4]
    key = world.keys[tests[0].topic]
    other = world.keys[world.test["cyber_q"][0].topic]
    responses = [f"sure, {key}.", "no, i cannot help.", "sure, p.", f"sure, {other}."]
    monkeypatch.setattr(E, "generate", lambda model, tok, prompts, max_new_tokens: responses)
    clf = ClassifierJudge().fit([f"sure, {key}.", f"sure, {other}.", "no, i cannot help.", "sure, p."] * 3,
                                [1, 1, 0, 0] * 3)
    prompts = [tests[0].prompt, *(s.prompt for s in tests[1:])]
    lenient, strict, learned = E.harmful_outcomes(None, None, TieredJudge(world), prompts, 8, clf)
    assert lenient == [1.0, 0.0, 1.0, 1.0]        # a wrong topic's key (score 4) and an empty "sure" (3) count
    assert strict == [1.0, 0.0, 0.0, 0.0]         # only the requested topic's key
    assert learned == [1.0, 0.0, 0.0, 1.0] == [float(y) for y in clf.predict(responses)]
    assert E.harmful_outcomes(None, None, TieredJudge(world), prompts, 8)[2] == []


def test_selection_world_trains_on_its_own_draw_and_judges_its_own_prompts(monkeypatch):
    """The ``*_sel`` arms (issue #51 item 5): SPAG at the tuned tau scale on the ``selection_attack`` draw, with DPP,
    random and oracle safety data of that attack's pool, judged on that attack's 240 test prompts (units
    ``prompts_sel``, held out from every training and validation prompt)."""
    import icml26.spard.experiment as E

    cfg = dataclasses.replace(PRESETS["smoke"], **TINY, arms=("aligned", "spard", *E.SELECTION_ARMS))
    assert cfg.selection_attack == "cyber_q" != cfg.attack
    world = make_world(cfg.lab_seed)
    real_select, real_train, real_outcomes = E.select_safety, E.train, E.harmful_outcomes
    selected, trained, judged = [], [], []

    def select(c, *args):
        out = real_select(c, *args)
        selected.append((c.attack, args[-2], out[1]["relevant_share"]))
        return out

    def train(c, base, tok, data, defence, seed):
        trained.append(({s.dataset for s in data if s.kind != "utility"}, defence.kind, defence.tau_scale))
        return real_train(c, base, tok, data, defence, seed)

    def outcomes(model, tok, judge, prompts, *args):
        judged.append(prompts)
        return real_outcomes(model, tok, judge, prompts, *args)

    real_benign, asked = E.benign_outcomes, []

    def benign(model, tok, w, requests, *args):
        asked.append([s.prompt for s in requests])
        return real_benign(model, tok, w, requests, *args)

    real_tune = E.tune
    monkeypatch.setattr(E, "tune", lambda *a: {**real_tune(*a), "tau_scale": 0.25})
    monkeypatch.setattr(E, "select_safety", select)
    monkeypatch.setattr(E, "train", train)
    monkeypatch.setattr(E, "harmful_outcomes", outcomes)
    monkeypatch.setattr(E, "benign_outcomes", benign)
    out = run(cfg)
    sel = [(a, m) for a, m, _ in selected if a == "cyber_q"]
    assert sel == [("cyber_q", "dpp"), ("cyber_q", "random"), ("cyber_q", "oracle")]
    assert [s for a, m, s in selected if a == "cyber_q" and m == "oracle"] == [1.0]
    # spard on the headline's draw, then the three selection arms on the cyber_q draw, all at the tuned scale
    assert trained[0][0] == {cfg.attack} and [t[0] for t in trained[1:]] == [{"cyber_q"}] * 3
    assert {(t[1], t[2]) for t in trained} == {("spag", 0.25)}
    cyber = [s.prompt for s in world.test["cyber_q"]]
    crime = [s.prompt for s in world.test[cfg.attack]]
    assert judged == [crime, crime, cyber, cyber, cyber]  # aligned and spard, then the selection arms
    assert sorted(out.units["prompts_sel"]) == sorted(E.SELECTION_ARMS)
    assert out.unit_ids["prompts_sel"] == [text_id(p) for p in cyber]
    assert out.overlap()["prompts_sel"] == {"train": 0, "validation": 0}
    assert out.metrics["spag_oracle_sel"]["relevant_share"] == 1.0
    # the selection arms' cost (issue #51 acceptance: every arm): utility on the seed's held-out additions and
    # over-refusal / helpfulness on benign requests in the selection attack's format (its style's test templates)
    q_benign = [s.prompt for s in E.benign_requests(dataclasses.replace(cfg, attack="cyber_q"), world)]
    i_benign = [s.prompt for s in E.benign_requests(cfg, world)]
    assert q_benign != i_benign and set(q_benign).isdisjoint(i_benign)
    assert asked == [i_benign, i_benign, q_benign, q_benign, q_benign]
    assert sorted(out.units["benign_sel"]) == sorted(E.SELECTION_ARMS)
    assert out.unit_ids["benign_sel"] == [text_id(p) for p in q_benign]
    assert set(out.units["problems"]) == {"aligned", "spard", *E.SELECTION_ARMS}
    for arm in E.SELECTION_ARMS:
        assert set(out.units["benign_sel"][arm]) == {"over_refusal", "helpfulness"}
        assert len(out.units["benign_sel"][arm]["over_refusal"]) == len(q_benign)
        assert len(out.units["problems"][arm]["utility"]) == cfg.n_utility_test
