"""The shared update-pass machinery: token-balanced micro-batches (against brute force), the activation meter
(against torch.profiler's memory events), stratified and full-trajectory cutoff laws."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from icml26.ps_ppo import MixtureCutoff, PromptConditionedCutoff, UniformCutoff
from icml26.ps_ppo.microbatch import (
    ActivationMeter,
    FullCutoff,
    StratifiedCutoff,
    micro_batched_backward,
    plan_micro_batches,
)


def _cost(lengths, plan):
    return max(len(r) * int(lengths[r].max()) for r in plan)


@pytest.mark.parametrize("seed", range(6))
def test_plan_is_a_partition_with_the_smallest_largest_micro_batch(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (7,), generator=g)
    for m in (1, 2, 3, 7, 9):
        plan = plan_micro_batches(lengths, m)
        assert len(plan) <= min(m, 7)
        assert sorted(torch.cat(plan).tolist()) == list(range(7))
        # brute force over contiguous cuts of the sorted order (the plan's search space)
        order = torch.argsort(lengths, stable=True)
        best = min(
            _cost(lengths, [order[a:b] for a, b in itertools.pairwise((0, *cuts, 7))])
            for k in range(min(m, 7))
            for cuts in itertools.combinations(range(1, 7), k)
        )
        assert _cost(lengths, plan) == best


def test_plan_bad_input():
    with pytest.raises(ValueError, match="n_micro"):
        plan_micro_batches(torch.tensor([3, 4]), 0)
    with pytest.raises(TypeError, match="keep_lengths"):
        plan_micro_batches([3, 4], 2)
    with pytest.raises(ValueError, match="keep_lengths"):
        plan_micro_batches(torch.tensor([3, 0]), 2)


def _profiled_net_bytes(fn):
    """Bytes allocated and not freed inside ``fn`` according to torch.profiler's memory events."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    return sum(e.self_cpu_memory_usage for e in prof.events()), out


def test_meter_matches_the_profiler_on_a_known_mlp():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    meter = ActivationMeter(mlp)

    def forward():
        with meter:
            x = torch.randn(32, 64)
            y = mlp(x)
            return (y * y).sum()  # y saved twice by the product: one storage

    net, loss = _profiled_net_bytes(forward)
    # alive after the forward: x, the hidden pre-activation, the GELU output and y (all saved) and the loss
    assert meter.bytes == 4 * (32 * 64 + 32 * 256 + 32 * 256 + 32 * 64)
    assert meter.bytes == net - loss.numel() * loss.element_size()


def test_meter_matches_the_profiler_on_a_tiny_llama():
    pytest.importorskip("transformers")
    from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm

    tok = char_tokenizer()
    model = tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0).train()
    meter = ActivationMeter(model)

    def forward():
        with meter:
            ids = torch.randint(3, len(tok), (4, 20), generator=torch.Generator().manual_seed(0))
            logits = model(input_ids=ids).logits
            return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, :, None]).sum()

    net, loss = _profiled_net_bytes(forward)
    assert meter.bytes > 0
    assert abs(meter.bytes - (net - loss.element_size())) <= 64  # the same live activation memory
    # the naive count (every saved tensor's bytes, weights included) overstates it
    naive = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: naive.append(t.numel() * t.element_size()) or t, lambda t: t
    ):
        model(input_ids=torch.randint(3, len(tok), (4, 20))).logits.sum()
    assert sum(naive) > 1.1 * meter.bytes


def test_micro_batched_backward_accumulates_the_full_gradient():
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 1).double()
    x, keep = torch.randn(10, 6, dtype=torch.float64), torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])

    def loss_of(rows, width):
        return (lin(x[rows]).squeeze(-1) * keep[rows]).sum() / 10

    stats = micro_batched_backward(keep, 3, loss_of, model=lin)
    grad = lin.weight.grad.clone()
    lin.zero_grad()
    loss_of(torch.arange(10), 9).backward()
    torch.testing.assert_close(grad, lin.weight.grad)
    assert stats.micro_batches == 3 and stats.tokens == _cost_sum(keep, plan_micro_batches(keep, 3))
    with pytest.raises(FloatingPointError):
        micro_batched_backward(keep, 2, lambda rows, width: torch.tensor(float("nan")), model=lin)


def _cost_sum(lengths, plan):
    return sum(len(r) * int(lengths[r].max()) for r in plan)


@pytest.mark.parametrize(
    "base",
    [UniformCutoff(), MixtureCutoff([FullCutoff(), UniformCutoff()], [0.25, 0.75])],
    ids=["uniform", "full_mixed"],
)
def test_stratified_draws_keep_the_marginal_law(base):
    law = StratifiedCutoff(base)
    lengths = torch.tensor([6, 6, 6, 6, 3, 3])
    keys = ["a"] * 4 + ["b"] * 2
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([law.sample(lengths, gen, keys=keys) for _ in range(5000)])
    survival = law.survival(lengths, 6, keys=keys).double()
    for i in range(len(lengths)):
        for t in range(1, int(lengths[i]) + 1):
            freq = float((draws[:, i] >= t).double().mean())
            assert freq == pytest.approx(float(survival[i, t - 1]), abs=0.03)
    # within a group of 4 uniform draws on {1..8}, every quarter of the range is hit exactly once
    u_draws = torch.stack(
        [
            StratifiedCutoff(UniformCutoff()).sample(torch.full((4,), 8), gen, keys=keys[:4])
            for _ in range(200)
        ]
    )
    assert all(sorted(((q - 1) // 2).tolist()) == [0, 1, 2, 3] for q in u_draws)


def test_stratified_draws_lower_the_spread_of_a_groups_kept_tokens():
    lengths = torch.full((8,), 40)
    gen = torch.Generator().manual_seed(1)
    plain = torch.stack([UniformCutoff().sample(lengths, gen).sum() for _ in range(500)]).double()
    strat = torch.stack(
        [StratifiedCutoff(UniformCutoff()).sample(lengths, gen, keys=[0] * 8).sum() for _ in range(500)]
    ).double()
    assert strat.std() < 0.5 * plain.std()
    assert abs(strat.mean() - plain.mean()) < 3


def test_full_cutoff_and_prompt_conditioned_stratification():
    lengths = torch.tensor([4, 2])
    assert FullCutoff().sample(lengths).tolist() == [4, 2]
    assert FullCutoff().survival(lengths, 4).tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    law = StratifiedCutoff(
        PromptConditionedCutoff(lambda k: FullCutoff() if k == "full" else UniformCutoff())
    )
    c = law.sample(torch.tensor([5, 5, 5]), torch.Generator().manual_seed(0), keys=["full", "x", "x"])
    assert int(c[0]) == 5
    with pytest.raises(ValueError):
        FullCutoff().sample(torch.tensor([0, 2]))
    assert np.isfinite(law.survival(torch.tensor([5, 5]), 5, keys=["full", "x"]).numpy()).all()
