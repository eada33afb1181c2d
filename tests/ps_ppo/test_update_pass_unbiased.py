"""The reproduction's own training step, ``experiment.update_pass``, is unbiased: its gradient averaged over the
cutoff law (exactly, over every cutoff of every row; and by Monte Carlo over draws of every law the reproduction
runs: uniform, stratified uniform, the stratified full + uniform mixture and the stratified prompt-conditioned law
of ``ps_ppo_adaptive``, fed the batch's rollouts by ``observe_groups`` as in training) equals the full-trajectory
Dr.GRPO gradient, computed here from the model's logits without any of the package's code; the unweighted
truncation (``weighted=False``, the plain-truncation control) does not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from icml26.common.tiny_lm import char_tokenizer, completion_batch, tiny_causal_lm
from icml26.ps_ppo import MixtureCutoff, UniformCutoff
from icml26.ps_ppo.experiment import Config, make_law, observe_groups, update_pass
from icml26.ps_ppo.microbatch import FullCutoff, StratifiedCutoff

PROMPTS = ["3+4+1=", "3+4+1=", "9+9+2=", "9+9+2="]
COMPLETIONS = ["3+4=7;7+1=8", "3+4=8;8+1=9", "9+9=18;18+2=20", "20"]
KEYS = ["a", "a", "b", "b"]
REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0])  # each prompt's group has a correct and an incorrect rollout
ADV = torch.tensor([0.5, -0.5, 1.0, -1.0], dtype=torch.float64)
L_MAX = 16
CFG = dataclasses.replace(Config(), ppo_epochs=1, micro_batches=2, max_new_tokens=L_MAX)


@pytest.fixture(scope="module")
def lab():
    tok = char_tokenizer()
    model = tiny_causal_lm(
        len(tok), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, seed=0
    ).double()
    batch = completion_batch(tok, PROMPTS, COMPLETIONS)
    return model, batch, batch["completion_mask"].sum(1).long()


def _flat_grad(model):
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])


def _pass_gradient(model, batch, advantages, cutoffs, survival, weighted=True):
    """The gradient ``update_pass`` leaves behind (one epoch; an SGD step with lr 0 keeps the parameters)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    update_pass(model, opt, batch, advantages, cutoffs, survival, cfg=CFG, weighted=weighted)
    return _flat_grad(model)


def _full_gradient(model, batch):
    """-(1 / (B L_max)) sum_i A_i sum_t grad log pi(y_it): the full-trajectory objective at ratio 1, from the logits."""
    model.zero_grad(set_to_none=True)
    ids, comp = batch["input_ids"], batch["completion_mask"]
    logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits.double()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    (-(ADV[:, None] * logp * comp[:, 1:]).sum() / (len(ids) * L_MAX)).backward()
    return _flat_grad(model)


@pytest.fixture(scope="module")
def table(lab):
    """G[i][c - 1]: update_pass's gradient with row i alone carrying its advantage, cut at c (weighted and not);
    the survival is the uniform law's (the 1 / S weights are the only place it enters)."""
    model, batch, lengths = lab
    survival = UniformCutoff().survival(lengths, int(lengths.max()))
    return {weighted: _rows(model, batch, lengths, survival, weighted) for weighted in (True, False)}, survival


def _rows(model, batch, lengths, survival, weighted):
    """Per row i, the (L_i, P) stack of update_pass's gradients with row i alone carrying its advantage, cut at
    c = 1..L_i (the other rows uncut)."""
    rows = []
    for i, L in enumerate(lengths.tolist()):
        adv = torch.zeros_like(ADV)
        adv[i] = ADV[i]
        per_cut = []
        for c in range(1, L + 1):
            cutoffs = lengths.clone()
            cutoffs[i] = c
            per_cut.append(_pass_gradient(model, batch, adv, cutoffs, survival, weighted))
        rows.append(torch.stack(per_cut))
    return rows


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_update_pass_is_additive_over_rows(lab, table):
    """One pass on a batch of mixed cutoffs (micro-batched) is the sum of the single-row table entries: the table
    is update_pass itself, so expectations over it are expectations of update_pass."""
    model, batch, lengths = lab
    tab, survival = table
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        cutoffs = UniformCutoff().sample(lengths, g)
        direct = _pass_gradient(model, batch, ADV, cutoffs, survival)
        summed = sum(tab[True][i][c - 1] for i, c in enumerate(cutoffs.tolist()))
        assert _rel(direct, summed) < 1e-9


def _law(name, batch):
    """The reproduction's law of an arm (``make_law``), the prompt-conditioned one fed this batch's rollouts."""
    if name == "uniform":
        return UniformCutoff()
    if name == "mixture":
        return MixtureCutoff([FullCutoff(), UniformCutoff()], [0.25, 0.75])
    law = make_law({"stratified": "ps_ppo", "stratified_mixture": "ps_ppo_mixed",
                    "prompt_conditioned": "ps_ppo_adaptive"}[name])
    observe_groups(law, KEYS, batch, REWARDS)
    return law


@pytest.mark.parametrize("name", ["uniform", "mixture", "prompt_conditioned"])
def test_exact_expectation_of_update_pass_is_the_full_gradient(lab, name):
    """E_c[grad] = sum_i sum_c q_i(c) G_i(c) with q_i(c) = S_i(c) - S_i(c + 1): equal to the full gradient with the
    1 / S weights (to float32 log-softmax rounding), far from it without them."""
    model, batch, lengths = lab
    law = _law(name, batch)
    if name == "prompt_conditioned":  # the decision points the rollouts imply: group b's differ at the 1st token
        assert law.base.decision["a"][0] > law.base.decision["b"][0] == 1.0
    survival = law.survival(lengths, int(lengths.max()), keys=KEYS).double()
    full = _full_gradient(model, batch)

    def expectation(weighted):
        total = torch.zeros_like(full)
        for i, L in enumerate(lengths.tolist()):
            adv = torch.zeros_like(ADV)
            adv[i] = ADV[i]  # row i alone carries an advantage: the pass's gradient is row i's term
            s = torch.cat([survival[i, :L], torch.zeros(1, dtype=torch.float64)])
            for c in range(1, L + 1):
                q = float(s[c - 1] - s[c])  # P(c_i = c)
                if q > 0.0:
                    cutoffs = lengths.clone()
                    cutoffs[i] = c
                    total += q * _pass_gradient(model, batch, adv, cutoffs, survival.float(), weighted)
        return total

    weighted, unweighted = expectation(True), expectation(False)
    assert _rel(weighted, full) < 1e-5
    assert _rel(unweighted, full) > 0.2  # the plain-truncation control is biased


def test_monte_carlo_over_stratified_draws_converges_to_the_full_gradient(lab, table):
    """Stratified draws (the reproduction's law: ``StratifiedCutoff(UniformCutoff())``, strata per prompt key): the
    mean of update_pass's gradient over n draws approaches the full gradient like n^(-1/2); the unweighted mean
    levels off at its bias."""
    model, batch, lengths = lab
    tab, _ = table
    law = StratifiedCutoff(UniformCutoff())
    full = _full_gradient(model, batch)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([law.sample(lengths, g, keys=KEYS) for _ in range(8000)])  # (n, B)
    # a few draws through update_pass directly, with the reproduction's survival (the base law's)
    survival = law.survival(lengths, int(lengths.max()), keys=KEYS)
    for cutoffs in draws[:2]:
        direct = _pass_gradient(model, batch, ADV, cutoffs, survival)
        assert _rel(direct, sum(tab[True][i][c - 1] for i, c in enumerate(cutoffs.tolist()))) < 1e-9

    def mean_error(weighted, n):
        # the mean over the first n draws of sum_i G_i(c_i): each cut's gradient times its share of the draws
        mean = sum(
            (torch.bincount(draws[:n, i] - 1, minlength=L).double()[:, None] * tab[weighted][i]).sum(0) / n
            for i, L in enumerate(lengths.tolist())
        )
        return _rel(mean, full)

    small, large = mean_error(True, 500), mean_error(True, 8000)
    assert large < 0.04 and large < small / 3  # 16x the draws: a factor 4 (or more, stratified) expected
    assert mean_error(False, 8000) > 0.2


def _law_table(model, batch, lengths, survival, unweighted):
    """G[weighted][i][c - 1] for the given survival (as ``table``; the unweighted entries do not depend on it)."""
    return {False: unweighted, True: _rows(model, batch, lengths, survival, True)}


@pytest.mark.parametrize("name", ["uniform", "stratified_mixture", "prompt_conditioned"])
def test_monte_carlo_through_update_pass_for_every_law(lab, table, name):
    """For the plain uniform law, the reproduction's stratified mixture and its stratified prompt-conditioned law
    (decision points read off the batch's rollouts, as in training): cutoffs drawn by the law, the weights
    update_pass applies from the law's survival; the mean gradient over n draws approaches the full gradient
    (log-log slope of the error over n = 100 ... 1,600 below -0.35, -0.5 expected), and the unweighted control stays biased."""
    model, batch, lengths = lab
    law = _law(name, batch)
    survival = law.survival(lengths, int(lengths.max()), keys=KEYS)
    tab = _law_table(model, batch, lengths, survival, table[0][False])
    full = _full_gradient(model, batch)
    g = torch.Generator().manual_seed(1)
    draws = torch.stack([law.sample(lengths, g, keys=KEYS) for _ in range(1600)])  # (n, B)
    for cutoffs in draws[:2]:  # the table is update_pass on these draws
        direct = _pass_gradient(model, batch, ADV, cutoffs, survival)
        assert _rel(direct, sum(tab[True][i][c - 1] for i, c in enumerate(cutoffs.tolist()))) < 1e-9

    def mean_error(weighted, n):
        mean = sum(
            (torch.bincount(draws[:n, i] - 1, minlength=L).double()[:, None] * tab[weighted][i]).sum(0) / n
            for i, L in enumerate(lengths.tolist())
        )
        return _rel(mean, full)

    ns = (100, 200, 400, 800, 1600)
    errors = [mean_error(True, n) for n in ns]
    slope = float(np.polyfit(np.log(ns), np.log(errors), 1)[0])
    biased = [mean_error(False, n) for n in ns]
    assert slope < -0.35 and errors[-1] < 0.1, (errors, slope)  # n^(-1/2): slope -0.5
    assert min(biased) > 0.2  # the unweighted control levels off at its bias
