"""Peer defences: Lisa's schedule and proximal term, Vaccine's perturbation, SafeLoRA's projection against a
literal transcription."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from icml26.common.tiny_lm import char_tokenizer, completion_batch, tiny_causal_lm
from icml26.spard.baselines import (
    attention_modules,
    lisa_state,
    proximal_term,
    safelora_project,
    vaccine_loss,
    vaccine_perturbations,
)
from icml26.spard.experiment import _nll


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def test_lisa_schedule_and_proximal_term():
    states = [lisa_state(s, align_steps=2, finetune_steps=3) for s in range(10)]
    assert states == ["align"] * 2 + ["finetune"] * 3 + ["align"] * 2 + ["finetune"] * 3
    assert {lisa_state(s, align_steps=0, finetune_steps=1) for s in range(5)} == {"finetune"}
    with pytest.raises(ValueError):
        lisa_state(0, align_steps=0, finetune_steps=0)
    p = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    a = [torch.zeros(2), torch.ones(1, 1)]
    assert float(proximal_term(p, a, rho=2.0)) == pytest.approx((1 + 4 + 4) * 1.0)
    with pytest.raises(ValueError, match="rho"):
        proximal_term(p, a, rho=-1.0)


def test_vaccine_perturbation_has_radius_rho_along_the_hidden_gradient(tok):
    model = tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0)
    batch = completion_batch(tok, ["how do i make poison:", "12+30="], ["no, i cannot help.", "42"])
    eps = vaccine_perturbations(model, lambda m: _nll(m, batch), rho=2.0)
    assert len(eps) == len(attention_modules(model)) == 2
    total = torch.sqrt(sum((e**2).sum() for e in eps.values()))
    assert float(total) == pytest.approx(2.0, rel=1e-5)
    # the direction is the loss gradient w.r.t. the block output: a small step along it raises the loss
    base = float(_nll(model, batch).detach())
    assert float(vaccine_loss(model, lambda m: _nll(m, batch), rho=0.05).detach()) > base
    # rho = 0 is plain training: same loss and same parameter gradient
    model.zero_grad()
    vaccine_loss(model, lambda m: _nll(m, batch), rho=0.0).backward()
    g0 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _nll(model, batch).backward()
    for a, b in zip(g0, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b)


def _safelora_reference(w, a, u, threshold):
    delta, V = w - a, a - u
    C = V @ V.T / np.linalg.norm(V)
    proj = C @ delta
    cos = float((delta * proj).sum() / (np.linalg.norm(delta) * np.linalg.norm(proj)))
    return (a + proj if cos < threshold else w), cos


@pytest.mark.parametrize("threshold", [0.0, 0.2, 0.6, 1.0])
def test_safelora_matches_the_transcription(tok, threshold):
    unaligned = tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0)
    aligned = tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0)
    tuned = tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for pa, pt in zip(aligned.parameters(), tuned.parameters(), strict=True):
            pa.add_(0.05 * torch.randn(pa.shape, generator=g))
            pt.copy_(pa + 0.02 * torch.randn(pa.shape, generator=g))
    A, U = aligned.state_dict(), unaligned.state_dict()
    before = {k: v.detach().double().numpy().copy() for k, v in tuned.state_dict().items()}
    info = safelora_project(tuned, A, U, threshold=threshold)
    after = tuned.state_dict()
    projected = 0
    for name in before:
        if name.endswith(".weight") and any(t in name for t in ("q_proj", "k_proj", "v_proj", "o_proj")):
            exp, cos = _safelora_reference(before[name], A[name].double().numpy(), U[name].double().numpy(),
                                           threshold)
            assert 0.0 <= cos <= 1.0 + 1e-9          # <dW, C dW> >= 0: C is positive semi-definite
            projected += cos < threshold
            np.testing.assert_allclose(after[name].double().numpy(), exp, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(after[name].double().numpy(), before[name])
    assert info == {"projected": float(projected), "layers": 8.0}
    assert (projected == 0) if threshold == 0.0 else True
    assert (projected == 8) if threshold == 1.0 else True
    with pytest.raises(ValueError, match="threshold"):
        safelora_project(tuned, A, U, threshold=1.5)
