"""The proof in tests: on a float64 tiny Llama the mean truncated gradient converges to the full gradient; a
token-count normaliser does not; a prefix-only forward gives exactly the prefix's log-probs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from icml26.common.tiny_lm import char_tokenizer, completion_batch, completion_logps, tiny_causal_lm
from icml26.ps_ppo import GeometricCutoff, MixtureCutoff, UniformCutoff
from icml26.ps_ppo.experiment import gradient_unbiasedness

PROMPTS = ["3+4+1=", "9+9+2=", "rev:abc=", "1+1="]
COMPLETIONS = ["3+4=7;7+1=8", "9+9=18;18+2=20", "cba", "2"]
ADV = torch.tensor([1.0, -0.5, 0.7, -1.2])


@pytest.fixture(scope="module")
def lab():
    tok = char_tokenizer()
    return tiny_causal_lm(len(tok), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, seed=0), tok


@pytest.mark.parametrize("law", [UniformCutoff(), MixtureCutoff([UniformCutoff(), GeometricCutoff(0.25)], [0.5, 0.5])],
                         ids=["uniform", "mixed"])
def test_mean_truncated_gradient_converges_to_the_full_gradient(lab, law):
    model, tok = lab
    errors, cos = gradient_unbiasedness(model, tok, PROMPTS, COMPLETIONS, ADV, law, [100, 400, 1600, 6400], seed=0)
    assert errors[-1] < 0.05 and cos > 0.998
    assert errors[-1] < errors[0] / 3  # shrinking like n^(-1/2) (a factor 8 expected over 64x the draws)


def test_a_token_count_normaliser_is_biased(lab):
    model, tok = lab
    errors, _ = gradient_unbiasedness(model, tok, PROMPTS, COMPLETIONS, ADV, UniformCutoff(), [100, 400, 1600, 6400],
                                      seed=0, normalizer="tokens")
    assert errors[-1] > 0.1  # it levels off instead of vanishing
    assert errors[-1] > errors[0] / 3


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
