"""The proof in tests: on a float64 tiny Llama the mean truncated gradient converges to the full gradient; a
token-count normaliser does not; a prefix-only forward gives exactly the prefix's log-probs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from icml26.common.tiny_lm import char_tokenizer, completion_batch, completion_logps, tiny_causal_lm
from icml26.ps_ppo import GeometricCutoff, MixtureCutoff, UniformCutoff
from icml26.ps_ppo.experiment import gradient_unbiasedness, gradient_unbiasedness_replicated

PROMPTS = ["3+4+1=", "9+9+2=", "rev:abc=", "1+1="]
COMPLETIONS = ["3+4=7;7+1=8", "9+9=18;18+2=20", "cba", "2"]
ADV = torch.tensor([1.0, -0.5, 0.7, -1.2])


@pytest.fixture(scope="module")
def lab():
    tok = char_tokenizer()
    return tiny_causal_lm(len(tok), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, seed=0), tok


@pytest.mark.parametrize(
    "law",
    [UniformCutoff(), MixtureCutoff([UniformCutoff(), GeometricCutoff(0.25)], [0.5, 0.5])],
    ids=["uniform", "mixed"],
)
def test_mean_truncated_gradient_converges_to_the_full_gradient(lab, law):
    model, tok = lab
    errors, cos = gradient_unbiasedness(
        model, tok, PROMPTS, COMPLETIONS, ADV, law, [100, 400, 1600, 6400], seed=0
    )
    assert errors[-1] < 0.05 and cos > 0.998
    assert errors[-1] < errors[0] / 3  # shrinking like n^(-1/2) (a factor 8 expected over 64x the draws)


def test_a_token_count_normaliser_is_biased(lab):
    model, tok = lab
    errors, _ = gradient_unbiasedness(
        model,
        tok,
        PROMPTS,
        COMPLETIONS,
        ADV,
        UniformCutoff(),
        [100, 400, 1600, 6400],
        seed=0,
        normalizer="tokens",
    )
    assert errors[-1] > 0.1  # it levels off instead of vanishing
    assert errors[-1] > errors[0] / 3


def test_replications_share_gradients_and_draws_without_changing_them(lab):
    model, tok = lab
    draws = [20, 80]
    reps = gradient_unbiasedness_replicated(
        model, tok, PROMPTS, COMPLETIONS, ADV, UniformCutoff(), draws, [3, 7], ("constant", "tokens")
    )
    for normalizer in ("constant", "tokens"):
        assert len(reps[normalizer]) == 2
        for seed, (errors, cos) in zip([3, 7], reps[normalizer], strict=True):
            alone, alone_cos = gradient_unbiasedness(
                model,
                tok,
                PROMPTS,
                COMPLETIONS,
                ADV,
                UniformCutoff(),
                draws,
                seed=seed,
                normalizer=normalizer,
            )
            np.testing.assert_allclose(errors, alone, rtol=1e-12)
            assert cos == pytest.approx(alone_cos, rel=1e-12)
    assert reps["constant"][0][0] != reps["constant"][1][0]  # the replications draw independently
    with pytest.raises(ValueError, match="normalizers"):
        gradient_unbiasedness_replicated(
            model, tok, PROMPTS, COMPLETIONS, ADV, UniformCutoff(), draws, [0], ("mean",)
        )


def test_vectorised_draws_match_a_loop_over_draws(lab):
    """The mean truncated gradient after n draws, literally: one draw at a time, each truncated gradient in full."""
    model, tok = lab
    law, n, seed = MixtureCutoff([UniformCutoff(), GeometricCutoff(0.25)], [0.5, 0.5]), 30, 5
    m = __import__("copy").deepcopy(model).double()
    batch = completion_batch(tok, PROMPTS, COMPLETIONS)
    logps, mask = completion_logps(m, batch)
    lengths = mask.sum(1).long()
    Lc = int(lengths.max())
    aligned = torch.zeros(len(PROMPTS), Lc, dtype=torch.float64)
    for i in range(len(PROMPTS)):
        aligned[i, : int(lengths[i])] = logps[i][mask[i] > 0]
    params = [p for p in m.parameters() if p.requires_grad]
    flat = lambda gs: torch.cat([g.reshape(-1) for g in gs])  # noqa: E731
    full = flat(
        torch.autograd.grad(
            (ADV.double()[:, None] * aligned).sum() / (len(PROMPTS) * Lc), params, retain_graph=True
        )
    )
    S = law.survival(lengths, Lc).double()
    gen = torch.Generator().manual_seed(seed)
    total = torch.zeros_like(full)
    for _ in range(n):
        c = law.sample(lengths, gen)
        w = torch.zeros(len(PROMPTS), Lc, dtype=torch.float64)
        for i in range(len(PROMPTS)):
            w[i, : int(c[i])] = 1.0 / S[i, : int(c[i])]
        total += flat(
            torch.autograd.grad(
                (ADV.double()[:, None] * w * aligned).sum() / (len(PROMPTS) * Lc), params, retain_graph=True
            )
        )
    expected = float(torch.linalg.vector_norm(total / n - full) / torch.linalg.vector_norm(full))
    errors, _ = gradient_unbiasedness(model, tok, PROMPTS, COMPLETIONS, ADV, law, [n], seed=seed)
    # tiny_lm.completion_logps takes log_softmax in float32 (it casts the logits), so a sum of per-token gradients
    # and the gradient of the sum agree to float32 round-off only (about 1e-7 here, amplified by the difference)
    assert errors[0] == pytest.approx(expected, rel=1e-5)


def test_prefix_forward_is_exact_for_a_causal_lm(lab):
    model, tok = lab
    batch = completion_batch(tok, PROMPTS[:1], COMPLETIONS[:1])
    full, mask = completion_logps(model, batch)
    prompt_len = int((batch["completion_mask"][0] == 0).sum())
    for c in (1, 3, 6):
        sub = {k: v[:, : prompt_len + c] for k, v in batch.items()}
        prefix, _ = completion_logps(model, sub)
        idx = np.flatnonzero(mask[0].numpy())[:c]
        torch.testing.assert_close(prefix[0, idx], full[0, idx], rtol=1e-5, atol=1e-6)
