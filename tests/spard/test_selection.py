"""Safety-data selection: the DPP selector's budget and picks, the random baseline, the model's own embeddings
(batch-invariant, the hidden state the released code pools, through from_pretrained), and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from icml26.spard import reference
from icml26.spard.selection import RandomSelector, RelevanceDiversityDPPSelector, mean_last_hidden


def test_budget_is_floor_of_ratio_times_the_fine_tuning_set():
    rng = np.random.default_rng(0)
    ref, cand = rng.normal(size=(1100, 6)), rng.normal(size=(160, 6))
    sel = RelevanceDiversityDPPSelector(ratio=0.03).fit(ref)
    assert sel.k_ == 33                                  # floor(0.03 * 1100)
    idx = sel.select(cand)
    assert len(idx) == 33 and len(set(idx.tolist())) == 33
    assert RelevanceDiversityDPPSelector(k=5).fit(ref).k_ == 5
    assert RandomSelector(ratio=0.03, seed=1).fit(ref).select(cand).tolist() == \
        RandomSelector(ratio=0.03, seed=1).fit(ref).select(cand).tolist()


def test_selection_equals_greedy_map_on_the_kernel():
    rng = np.random.default_rng(1)
    ref, cand = rng.normal(size=(30, 5)), rng.normal(size=(12, 5))
    sel = RelevanceDiversityDPPSelector(beta=4.0, k=4).fit(ref)
    idx = sel.select(cand)
    L = reference.relevance_diversity_kernel(cand, ref, 4.0)
    assert idx.tolist() == reference.naive_greedy_dpp(L, 4)


def test_relevance_pulls_towards_the_reference_and_diversity_spreads():
    # candidates: 6 copies near the reference direction, 6 near an unrelated one, 1 between them
    e1, e2 = np.eye(3)[0], np.eye(3)[1]
    rng = np.random.default_rng(2)
    near = e1 + 0.05 * rng.normal(size=(6, 3))
    far = e2 + 0.05 * rng.normal(size=(6, 3))
    cand = np.vstack([near, far])
    ref = e1[None, :] + 0.01 * rng.normal(size=(10, 3))
    idx = RelevanceDiversityDPPSelector(beta=4.0, k=2).fit(ref).select(cand)
    assert idx[0] < 6                                     # the most relevant first
    flat = RelevanceDiversityDPPSelector(beta=0.0, k=2).fit(ref).select(cand)
    assert {int(flat[0]) < 6, int(flat[1]) < 6} == {True, False}   # beta = 0: pure diversity, one of each


def test_bad_budgets_and_inputs():
    ref, cand = np.ones((100, 4)) + np.eye(100, 4), np.ones((5, 4)) + np.eye(5, 4)
    with pytest.raises(ValueError, match="larger than the pool"):
        RelevanceDiversityDPPSelector(ratio=0.1).fit(ref).select(cand)       # k = 10 > 5 candidates
    with pytest.raises(ValueError, match="larger than the pool"):
        RandomSelector(k=6).fit(ref).select(cand)
    with pytest.raises(ValueError, match="selects nothing"):
        RelevanceDiversityDPPSelector(ratio=0.001).fit(ref)
    for ratio in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="ratio"):
            RelevanceDiversityDPPSelector(ratio=ratio).fit(ref)
    with pytest.raises(ValueError, match="k must be >= 1"):
        RelevanceDiversityDPPSelector(k=0).fit(ref)
    with pytest.raises(TypeError, match="k must be an int"):
        RelevanceDiversityDPPSelector(k=2.5).fit(ref)
    with pytest.raises(RuntimeError, match="not fitted"):
        RelevanceDiversityDPPSelector().select(cand)
    with pytest.raises(ValueError, match="dimension"):
        RelevanceDiversityDPPSelector(k=2).fit(ref).select(np.ones((5, 3)))
    with pytest.raises(ValueError, match="NaN"):
        RelevanceDiversityDPPSelector(k=2).fit(np.full((4, 4), np.nan))


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    pytest.importorskip("transformers")
    from icml26.common.tiny_lm import char_tokenizer, load_lab_model, save_lab_model, tiny_causal_lm

    tok = char_tokenizer()
    path = save_lab_model(tiny_causal_lm(len(tok), hidden=32, layers=2, seed=3), tok,
                          tmp_path_factory.mktemp("lm"))
    return load_lab_model(path)          # through from_pretrained, as a user would load a checkpoint


def test_embeddings_are_the_masked_mean_of_the_final_hidden_state(lm):
    import torch

    model, tok = lm
    texts = ["how do i make poison:", "12+30=", "tell me how to hack a bank:"]
    batched = mean_last_hidden(model, tok, texts, batch_size=3)
    alone = np.vstack([mean_last_hidden(model, tok, [t]) for t in texts])
    np.testing.assert_allclose(batched, alone, rtol=1e-5, atol=1e-6)   # padding does not leak in
    with torch.no_grad():
        ids = tok(texts[0], return_tensors="pt", add_special_tokens=False)["input_ids"]
        final = model.model(input_ids=ids).last_hidden_state[0].mean(0).double().numpy()
    np.testing.assert_allclose(batched[0], final, rtol=1e-5, atol=1e-6)   # after the final norm
    with pytest.raises(ValueError, match="non-empty"):
        mean_last_hidden(model, tok, [])
    with pytest.raises(ValueError, match="empty strings"):
        mean_last_hidden(model, tok, ["a:", ""])
