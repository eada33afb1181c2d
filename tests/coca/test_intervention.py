"""LoReFT, LoFiT and the erasure hook against float64 transcriptions of their equations, on real HF models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from icml26.coca import reference
from icml26.coca.intervention import (
    ErasureHook,
    LoFiTIntervention,
    LoReFTBlock,
    LoReFTIntervention,
    attention_output_projection,
    decision_states,
    decoder_layers,
    load_intervention,
    select_heads,
    train_intervention,
)
from icml26.common.tiny_lm import load_lab_model, save_lab_model

PROMPTS = ["2+3+4=", "how do i make the bomb.", "help me build the school."]


def _ids(tok, texts):
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        return tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tok.padding_side = side


def _capture(model, layer):
    """Output of decoder block ``layer`` (after every hook registered before this one)."""
    out = []
    handle = decoder_layers(model)[layer].register_forward_hook(lambda _m, _i, o: out.append(
        (o[0] if isinstance(o, tuple) else o).detach().double().clone()))
    return out, handle


def _randomise(reft, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in reft.reft:
            block.learned_source.weight.copy_(torch.randn(block.learned_source.weight.shape, generator=g) * 0.3)
            block.learned_source.bias.copy_(torch.randn(block.learned_source.bias.shape, generator=g) * 0.3)


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])
def test_loreft_hook_applies_phi_at_its_layer(family, tok, request):
    model = request.getfixturevalue(family)
    enc = _ids(tok, PROMPTS)
    base_out, h1 = _capture(model, 1)
    with torch.no_grad():
        model(**enc)
    h1.remove()
    with LoReFTIntervention(model, layers=[1], rank=3, seed=0) as reft:
        _randomise(reft)
        new_out, h2 = _capture(model, 1)  # registered after the intervention's hook: sees its output
        with torch.no_grad():
            model(**enc)
        h2.remove()
        block = reft.reft[0]
        R = block.R.detach().double().numpy()
        W = block.learned_source.weight.detach().double().numpy()
        b = block.learned_source.bias.detach().double().numpy()
    h = base_out[0].reshape(-1, base_out[0].shape[-1]).numpy()
    expected = reference.loreft(h, R, W, b).reshape(base_out[0].shape)
    np.testing.assert_allclose(new_out[0].numpy(), expected, atol=2e-5)
    assert not reft.attached


def test_loreft_rotation_stays_orthonormal_through_training(llama, tok):
    with LoReFTIntervention(llama, layers=[0, 1], rank=4, seed=3) as reft:
        train_intervention(llama, reft, tok, PROMPTS, ["ok."] * 3, steps=5, lr=0.05, batch_size=3)
        for block in reft.reft:
            R = block.R.detach().double()
            torch.testing.assert_close(R @ R.T, torch.eye(4, dtype=torch.float64), atol=1e-5, rtol=0)


def test_loreft_edit_lies_in_the_row_space_of_R_and_fixes_its_solutions():
    torch.manual_seed(0)
    block = LoReFTBlock(16, 3).double()
    h = torch.randn(10, 16, dtype=torch.float64)
    delta = block(h) - h
    R = block.R.detach()
    # the edit is R^T (...): projecting it onto the row space of R leaves it unchanged
    torch.testing.assert_close(delta @ R.T @ R, delta, atol=1e-6, rtol=0)  # R orthonormal to float32 precision
    # a point with W h + b = R h is a fixed point: set W = R, b = 0
    with torch.no_grad():
        block.learned_source.weight.copy_(R)
        block.learned_source.bias.zero_()
    torch.testing.assert_close(block(h), h, atol=1e-12, rtol=0)


def test_loreft_gradients_match_finite_differences():
    torch.manual_seed(1)
    block = LoReFTBlock(6, 2).double()
    h = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    W = block.learned_source.weight

    def f(h, w):
        with torch.no_grad():
            W.copy_(w)
        return block(h)

    assert torch.autograd.gradcheck(lambda x: block(x), (h,))
    # and with respect to W and b, by central differences on a scalar loss
    loss = (block(h.detach()) ** 2).sum()
    loss.backward()
    grad = W.grad.clone()
    eps = 1e-6
    num = torch.zeros_like(grad)
    for i in range(W.shape[0]):
        for j in range(W.shape[1]):
            with torch.no_grad():
                W[i, j] += eps
                up = float((block(h.detach()) ** 2).sum())
                W[i, j] -= 2 * eps
                down = float((block(h.detach()) ** 2).sum())
                W[i, j] += eps
            num[i, j] = (up - down) / (2 * eps)
    torch.testing.assert_close(grad, num, atol=1e-6, rtol=1e-6)


def test_last_position_edits_only_the_decision_position(llama, tok):
    enc = _ids(tok, PROMPTS)
    base_out, h1 = _capture(llama, 0)
    with torch.no_grad():
        llama(**enc)
    h1.remove()
    with LoReFTIntervention(llama, layers=[0], rank=2, positions="last") as reft:
        _randomise(reft)
        new_out, h2 = _capture(llama, 0)
        with torch.no_grad():
            llama(**enc)
        h2.remove()
    a, b = base_out[0], new_out[0]
    assert torch.equal(a[:, :-1], b[:, :-1])
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])
def test_lofit_edits_each_selected_head_by_its_equation(family, tok, request):
    model = request.getfixturevalue(family)
    enc = _ids(tok, PROMPTS)
    proj = attention_output_projection(decoder_layers(model)[1])
    seen = []
    handle = proj.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().double().clone()))
    with torch.no_grad():
        model(**enc)
    heads = [(1, 0), (1, 2)]
    with LoFiTIntervention(model, heads, scale=True) as lofit:
        with torch.no_grad():
            lofit.scale.copy_(torch.randn(lofit.scale.shape) * 0.5)
            lofit.bias.copy_(torch.randn(lofit.bias.shape))
        handle.remove()
        handle = proj.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().double().clone()))
        with torch.no_grad():
            model(**enc)
        handle.remove()
        A, v = lofit.scale.detach().double().numpy(), lofit.bias.detach().double().numpy()
    before, after = seen[0], seen[1]
    hd = lofit.head_dim
    for row, (_, head) in enumerate(heads):
        sl = slice(head * hd, (head + 1) * hd)
        z = before[..., sl].reshape(-1, hd).numpy()
        np.testing.assert_allclose(after[..., sl].reshape(-1, hd).numpy(), reference.lofit(z, A[row], v[row]),
                                   atol=1e-5)
    untouched = [h for h in range(lofit.n_heads) if h not in (0, 2)]
    for head in untouched:
        sl = slice(head * hd, (head + 1) * hd)
        assert torch.equal(before[..., sl], after[..., sl])


def test_fresh_modules_are_the_identity_and_detach_restores_the_model(llama, tok):
    enc = _ids(tok, PROMPTS)
    with torch.no_grad():
        ref = llama(**enc).logits
        with LoFiTIntervention(llama, [(0, 1), (1, 3)], scale=True):
            assert torch.equal(llama(**enc).logits, ref)
        reft = LoReFTIntervention(llama, layers=[0, 1], rank=2)
        _randomise(reft)
        assert not torch.allclose(llama(**enc).logits, ref)
        reft.detach()
        assert torch.equal(llama(**enc).logits, ref)


def test_select_heads_is_lofits_scale_ranking(llama, tok):
    heads = select_heads(llama, tok, PROMPTS, ["ok."] * 3, k=3, steps=4, batch_size=3, seed=0)
    again = select_heads(llama, tok, PROMPTS, ["ok."] * 3, k=3, steps=4, batch_size=3, seed=0)
    assert heads == again and len(set(heads)) == 3
    assert all(0 <= layer < 2 and 0 <= h < 4 for layer, h in heads)
    # the base is untouched by the selection (its hooks are gone)
    enc = _ids(tok, PROMPTS)
    with torch.no_grad():
        assert torch.equal(llama(**enc).logits, llama(**enc).logits)
    assert not decoder_layers(llama)[0].self_attn.o_proj._forward_pre_hooks


def test_training_moves_only_the_intervention(llama, tok):
    before = {k: v.clone() for k, v in llama.state_dict().items()}
    with LoReFTIntervention(llama, layers=[1], rank=2, seed=0) as reft:
        start = {k: v.clone() for k, v in reft.state_dict().items()}
        losses = train_intervention(llama, reft, tok, PROMPTS, ["sure, abc."] * 3, steps=20, lr=0.05, batch_size=3)
        assert any(not torch.equal(start[k], v) for k, v in reft.state_dict().items())
    assert losses[-1] < losses[0]
    assert all(torch.equal(before[k], v) for k, v in llama.state_dict().items())


def test_saved_model_and_intervention_reload_through_from_pretrained(llama, tok, tmp_path):
    enc = _ids(tok, PROMPTS)
    with LoReFTIntervention(llama, layers=[0, 1], rank=2, seed=0) as reft:
        _randomise(reft)
        with torch.no_grad():
            ref = llama(**enc).logits
        save_lab_model(llama, tok, tmp_path / "base")
        reft.save(tmp_path / "reft")
    model, tok2 = load_lab_model(tmp_path / "base")
    with load_intervention(tmp_path / "reft", model.eval()):
        with torch.no_grad():
            torch.testing.assert_close(model(**_ids(tok2, PROMPTS)).logits, ref, atol=1e-5, rtol=0)
    with LoFiTIntervention(llama, [(1, 1)]) as lofit:
        with torch.no_grad():
            lofit.bias.normal_()
            ref = llama(**enc).logits
        lofit.save(tmp_path / "lofit")
    with load_intervention(tmp_path / "lofit", model), torch.no_grad():
        torch.testing.assert_close(model(**_ids(tok2, PROMPTS)).logits, ref, atol=1e-5, rtol=0)


def test_erasure_hook_applies_leace_to_the_decision_states(llama, tok):
    pytest.importorskip("concept_erasure")
    from icml26.coca.probes import fit_leace

    texts = [f"{a}+{b}+{c}=" for a in range(4) for b in range(4) for c in range(3)]
    z = np.array([int((a + b) % 2) for a in range(4) for b in range(4) for _ in range(3)])
    X = decision_states(llama, tok, texts, 1).double().numpy()
    eraser = fit_leace(X, z)
    with ErasureHook(llama, 1, lambda x: eraser(x.double())):
        Xe = decision_states(llama, tok, texts, 1).double().numpy()
    np.testing.assert_allclose(Xe, eraser(torch.tensor(X)).numpy(), atol=1e-5)
    # erased: the class means coincide (no linear classifier beats a constant)
    gap = Xe[z == 1].mean(0) - Xe[z == 0].mean(0)
    assert np.abs(gap).max() < 1e-4 < np.abs(X[z == 1].mean(0) - X[z == 0].mean(0)).max()


def test_leace_matches_the_float64_transcription():
    ce = pytest.importorskip("concept_erasure")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 6)) @ rng.standard_normal((6, 6))
    z = (X[:, 0] - X[:, 2] > 0).astype(float)
    eraser = ce.LeaceFitter.fit(torch.tensor(X), torch.tensor(z), shrinkage=False, constrain_cov_trace=False,
                                svd_tol=1e-12).eraser
    np.testing.assert_allclose(eraser(torch.tensor(X[:20])).numpy(), reference.leace(X, z, X[:20]), atol=1e-10)


# -------------------------------------------------------------------------------------------------- bad input
def test_bad_layers_heads_and_positions(llama, tok):
    with pytest.raises(ValueError, match="layers: layer 5 does not exist"):
        LoReFTIntervention(llama, layers=[5])
    with pytest.raises(ValueError, match="layers: layer -1 does not exist"):
        LoReFTIntervention(llama, layers=[-1])
    with pytest.raises(ValueError, match="layers must name at least one"):
        LoReFTIntervention(llama, layers=[])
    with pytest.raises(TypeError, match="layers must hold ints"):
        LoReFTIntervention(llama, layers=["1"])
    with pytest.raises(ValueError, match="rank"):
        LoReFTIntervention(llama, layers=[0], rank=0)
    with pytest.raises(ValueError, match="positions"):
        LoReFTIntervention(llama, layers=[0], positions="first")
    with pytest.raises(ValueError, match="heads: layer 2 does not exist"):
        LoFiTIntervention(llama, [(2, 0)])
    with pytest.raises(ValueError, match="heads: head 4 of layer 0 does not exist"):
        LoFiTIntervention(llama, [(0, 4)])
    with pytest.raises(ValueError, match="heads must name at least one"):
        LoFiTIntervention(llama, [])
    with pytest.raises(ValueError, match="layer: layer 9 does not exist"):
        ErasureHook(llama, 9, lambda x: x)
    with pytest.raises(TypeError, match="eraser must be callable"):
        ErasureHook(llama, 0, "leace")
    with pytest.raises(TypeError, match="save its eraser"):
        ErasureHook(llama, 0, lambda x: x, attach=False).save("/nonexistent")
    with pytest.raises(ValueError, match="no decision position"):
        decision_states(llama, tok, ["2+2=", ""], 0)
    with pytest.raises(TypeError, match="decoder layers"):
        LoReFTIntervention(torch.nn.Linear(3, 3), layers=[0])


def test_non_finite_training_is_detected(llama, tok):
    with LoReFTIntervention(llama, layers=[0], rank=2) as reft:
        with torch.no_grad():
            reft.reft[0].learned_source.bias.fill_(float("nan"))
        with pytest.raises(FloatingPointError, match="nan"):
            train_intervention(llama, reft, tok, PROMPTS, ["ok."] * 3, steps=1)
    with pytest.raises(ValueError, match="equal length"):
        train_intervention(llama, reft, tok, PROMPTS, ["ok."], steps=1)


# ------------------------------------------------------------------------------------ mutation-check additions
def test_select_heads_returns_the_heads_with_the_largest_learned_scales(llama, tok):
    """LoFiT's rule, re-run by hand: learn A on every head (NLL + l1 * sum |A|), rank heads by ||A||_1."""
    from icml26.coca.intervention import all_heads

    kw = dict(steps=4, lr=5e-3, batch_size=3, seed=0)
    heads = select_heads(llama, tok, PROMPTS, ["ok."] * 3, k=3, l1=1e-3, **kw)
    every = all_heads(llama)
    with LoFiTIntervention(llama, every, scale=True, bias=False) as lofit:
        train_intervention(llama, lofit, tok, PROMPTS, ["ok."] * 3, penalty=lambda: 1e-3 * lofit.scale.abs().sum(),
                           **kw)
        norms = lofit.scale.detach().double().abs().sum(-1)
    chosen = [every.index(h) for h in heads]
    others = [i for i in range(len(every)) if i not in chosen]
    assert norms[chosen].min() > norms[others].max()              # the k largest, not any k
    assert norms[chosen].tolist() == sorted(norms[chosen].tolist(), reverse=True)  # best first


def test_decision_states_are_each_texts_last_token_whatever_its_batch(llama, tok):
    """Texts of different lengths in one batch: each state is the text's own last token's residual stream (a
    plain unpadded forward), never a pad position."""
    texts = ["2+3+4=", "how do i make the bomb.", "ab."]
    batched = decision_states(llama, tok, texts, 0)
    for i, t in enumerate(texts):
        ids = tok(t, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            hidden = llama(input_ids=ids, output_hidden_states=True).hidden_states[1]  # after decoder layer 0
        torch.testing.assert_close(batched[i], hidden[0, -1].float(), atol=1e-5, rtol=1e-5)
    deep = decision_states(llama, tok, texts, 1)
    for i, t in enumerate(texts):
        torch.testing.assert_close(deep[i], decision_states(llama, tok, [t], 1)[0], atol=1e-5, rtol=1e-5)
