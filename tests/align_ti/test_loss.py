"""Align-TI's losses against the float64 reference, finite differences, the per-branch forward, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml26.align_ti import reference
from icml26.align_ti.loss import (
    AlignTILoss,
    Branches,
    branch_logits,
    build_branch_attention_mask,
    extend_with_branches,
    generalized_jsd,
    instruction_relevance_scores,
    instruction_vision_attention,
    irs_from_alphas,
    iva_divergence,
    iva_hidden_divergence,
    kd_divergence,
    propose_alternatives,
    student_layer_for,
    tpa_divergence,
)


def _logits(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_kd_matches_reference(direction, temperature):
    s, t = _logits(0, 3, 5, 7), _logits(1, 3, 5, 7)
    mask = torch.rand(3, 5, generator=torch.Generator().manual_seed(2)) > 0.4
    ours = kd_divergence(s, t, mask, temperature=temperature, direction=direction)
    ref = reference.kd(s.numpy(), t.numpy(), mask.numpy(), temperature, direction)
    assert float(ours) == pytest.approx(ref, rel=1e-5)


def test_kd_gradient_matches_finite_differences():
    s = _logits(3, 2, 4, 5).requires_grad_(True)
    t = _logits(4, 2, 4, 5)
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda x: kd_divergence(x, t, mask).double(), (s,), eps=1e-6, atol=1e-4)


def test_kd_is_zero_on_equal_logits_and_ignores_masked_positions():
    s = _logits(5, 2, 3, 4)
    mask = torch.tensor([[1, 0, 0], [0, 0, 1]], dtype=torch.bool)
    assert float(kd_divergence(s, s, mask)) == pytest.approx(0.0, abs=1e-12)
    t = s.clone()
    t[0, 1] += 5.0  # a masked-out position
    assert float(kd_divergence(s, t, mask)) == pytest.approx(0.0, abs=1e-12)


def test_generalized_jsd_matches_trl():
    trl = pytest.importorskip("trl.experimental.gkd")
    s, t = _logits(6, 2, 4, 6).float(), _logits(7, 2, 4, 6).float()
    labels = torch.tensor([[-100, 1, 2, 3], [-100, -100, 1, 2]])
    for beta in (0.0, 0.5, 0.9, 1.0):
        theirs = trl.GKDTrainer.generalized_jsd_loss(s, t, labels=labels, beta=beta)
        assert float(generalized_jsd(s, t, labels != -100, beta=beta)) == pytest.approx(
            float(theirs), rel=1e-5
        )


def test_alpha_and_irs_match_reference():
    g = torch.Generator().manual_seed(8)
    attn = torch.rand(2, 3, 6, 6, generator=g, dtype=torch.float64).softmax(-1)
    visual = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 0, 0]], dtype=torch.bool)
    inst = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)  # row 1: no instruction
    ours = instruction_vision_attention(attn, visual, inst)
    assert np.allclose(ours.numpy(), reference.alpha(attn.numpy(), visual.numpy(), inst.numpy()), atol=1e-12)
    assert np.allclose(ours[1, 1:4].numpy(), 1 / 3)  # uniform without instruction tokens
    a, b = (
        torch.rand(3, 4, 5, generator=g, dtype=torch.float64),
        torch.rand(3, 4, 5, generator=g, dtype=torch.float64),
    )
    assert np.allclose(irs_from_alphas(a, b).numpy(), reference.irs(a.numpy(), b.numpy()), atol=1e-12)
    assert np.allclose(
        irs_from_alphas(a, a).numpy(), 0.0, atol=1e-12
    )  # same focus for both instructions: IRS 0


@pytest.mark.parametrize("topk", [None, 2])
def test_iva_matches_reference_and_gradient(topk):
    s, t = _logits(9, 2, 6, 5), _logits(10, 2, 6, 5)
    w = torch.tensor([[0, 0.5, 0.3, 0.2, 0, 0], [0, 0.1, 0.1, 0.8, 0, 0]], dtype=torch.float64)
    ours = iva_divergence(s, t, w, topk=topk)
    wr = w.numpy().copy()
    if topk == 2:
        wr = np.array([[0, 0.5 / 0.8, 0.3 / 0.8, 0, 0, 0], [0, 0.1 / 0.9, 0, 0.8 / 0.9, 0, 0]])
        wr[1] = [0, 0, 0, 0, 0, 0]
        keep = torch.topk(w[1], 2).indices.tolist()  # tie between positions 1 and 2: follow torch's pick
        wr[1, keep] = w[1, keep].numpy() / w[1, keep].sum().item()
    assert float(ours) == pytest.approx(reference.iva(s.numpy(), t.numpy(), wr), rel=1e-6)
    x = s.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda z: iva_divergence(z, t, w, topk=topk).double(), (x,), eps=1e-6, atol=1e-4
    )


@pytest.mark.parametrize("topk", [None, 2])
def test_iva_hidden_matches_reference_and_gradient(topk):
    """IVA on hidden states against the float64 loops (projection and cosine written out), and its gradient in the
    student's states and in the projection against finite differences."""
    g = torch.Generator().manual_seed(11)
    s = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    t = torch.randn(2, 6, 5, generator=g, dtype=torch.float64) * 7.0  # another width, another scale
    proj = torch.randn(5, 3, generator=g, dtype=torch.float64)
    w = torch.tensor([[0, 0.5, 0.3, 0.2, 0, 0], [0, 0.1, 0.15, 0.75, 0, 0]], dtype=torch.float64)
    wr = w.numpy().copy()
    if topk == 2:
        wr = np.array([[0, 0.5 / 0.8, 0.3 / 0.8, 0, 0, 0], [0, 0, 0.15 / 0.9, 0.75 / 0.9, 0, 0]])
    ours = iva_hidden_divergence(s, t, w, proj, topk=topk)
    ref = reference.iva_hidden(s.numpy(), t.numpy(), wr, proj.numpy())
    assert float(ours) == pytest.approx(ref, rel=1e-10)
    # scale-free in both models' states: the teacher's and the student's norms do not matter
    assert float(iva_hidden_divergence(s * 3.0, t / 5.0, w, proj, topk=topk)) == pytest.approx(ref, rel=1e-10)
    x, p = s.clone().requires_grad_(True), proj.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a, b: iva_hidden_divergence(a, t, w, b, topk=topk), (x, p), eps=1e-6, atol=1e-5
    )
    # equal widths without a projection: the identity; aligned states (any positive scale) give 0
    same = torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    assert float(iva_hidden_divergence(same, 2.5 * same, w)) == pytest.approx(0.0, abs=1e-12)
    assert float(iva_hidden_divergence(same, t, w)) == pytest.approx(
        reference.iva_hidden(same.numpy(), t.numpy(), w.numpy()), rel=1e-10
    )
    # only the weighted (visual) positions count: other positions may hold anything
    t2 = t.clone()
    t2[:, 0] += 100.0
    t2[:, 5] *= -1.0
    assert float(iva_hidden_divergence(s, t2, w, proj, topk=topk)) == pytest.approx(ref, rel=1e-10)


def test_iva_hidden_bad_input():
    s, t, w = torch.zeros(1, 3, 4), torch.ones(1, 3, 6), torch.ones(1, 3) / 3
    with pytest.raises(ValueError, match="give a projection"):
        iva_hidden_divergence(s, t, w)
    with pytest.raises(ValueError, match="projection must be"):
        iva_hidden_divergence(s, t, w, torch.zeros(4, 6))
    with pytest.raises(ValueError, match="weights"):
        iva_hidden_divergence(s, t, torch.ones(1, 4), torch.zeros(6, 4))
    with pytest.raises(ValueError, match="non-negative"):
        iva_hidden_divergence(s, t, -w, torch.zeros(6, 4))
    with pytest.raises(ValueError, match="same B and T"):
        iva_hidden_divergence(s, torch.ones(1, 2, 6), w, torch.zeros(6, 4))
    assert [student_layer_for(layer, 3, 2) for layer in range(3)] == [0, 0, 1]
    assert [student_layer_for(layer, 4, 4) for layer in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="iva_layer"):
        student_layer_for(4, 4, 2)


def test_branch_mask_by_hand():
    m = build_branch_attention_mask(prefix_len=3, response_len=2, n_alt=2)
    assert m.shape == (9, 9)
    # branches of response position 0 (sequence position 3): see the 3-token prefix and themselves
    assert m[5].tolist() == [True, True, True, False, False, True, False, False, False]
    assert m[6].tolist() == [True, True, True, False, False, False, True, False, False]
    # branches of response position 1 (sequence position 4): the prefix and the first response token
    assert m[7].tolist() == [True, True, True, True, False, False, False, True, False]
    assert m[:5, :5].equal(torch.ones(5, 5, dtype=torch.bool).tril()) and not m[:5, 5:].any()


@pytest.fixture(scope="module")
def models():
    pytest.importorskip("transformers")
    from icml26.common.tiny_vlm import (
        SceneSpec,
        VLMSpec,
        encode,
        make_items,
        sample_scenes,
        tiny_vlm,
        vlm_tokenizer,
    )

    tok, scenes = vlm_tokenizer(), SceneSpec(grid=2)
    teacher = tiny_vlm(tok, VLMSpec(hidden=32, layers=2, intermediate=64), scenes, seed=0).eval()
    student = tiny_vlm(tok, VLMSpec(hidden=16, layers=1, intermediate=32), scenes, seed=1).eval()
    rng = np.random.default_rng(0)
    attrs = sample_scenes(scenes, rng, 3)
    batch = encode(tok, make_items(scenes, attrs, rng, ["patch", "count", "object"]), scenes, attrs, rng)
    return tok, teacher, student, batch


def test_one_pass_branch_forward_equals_per_branch_forward(models):
    tok, teacher, student, batch = models
    with torch.no_grad():
        plain = student(**{k: v for k, v in batch.items() if k != "labels"}).logits
        br = propose_alternatives(plain, batch["labels"], 3, exclude=(tok.convert_tokens_to_ids("<image>"),))
        ext = extend_with_branches(batch, br)
        s_ext, t_ext = student(**ext).logits, teacher(**ext).logits
    t_len = batch["input_ids"].shape[1]
    # the sequence positions of the extended pass are the plain forward's (padding aside)
    real = batch["attention_mask"].bool()
    assert torch.allclose(s_ext[:, :t_len][real], plain[real], atol=1e-5)
    ours = tpa_divergence(branch_logits(s_ext, t_len, br), branch_logits(t_ext, t_len, br), br)
    ref = reference.tpa_per_branch(
        student, teacher, batch, br.positions.numpy(), br.valid.numpy(), br.tokens.numpy(), br.weights.numpy()
    )
    assert float(ours) == pytest.approx(ref, rel=1e-4)
    # alternatives never repeat the true token, and the branch weights are a distribution
    truth = torch.gather(batch["labels"], 1, br.positions)
    assert not (br.tokens == truth[..., None]).any()
    assert torch.allclose(br.weights.sum(-1), torch.ones(br.weights.shape[:2]))


def test_propose_alternatives_by_hand():
    """Alternatives to y_k come from the student's logits at k - 1 (its distribution of y_k), never the true token,
    weighted by the student's probabilities renormalised over the alternatives; padded slots are marked invalid."""
    logits = torch.full((2, 4, 6), -3.0, dtype=torch.float64)
    # row 0: position 1 predicts y_2 (true 3, the student's favourite), position 2 predicts y_3 (true 1),
    # position 3 comes after the last token (never used); row 1: position 2 predicts y_3 (true 2)
    logits[0, 1] = torch.tensor([0.0, 1.0, 2.0, 5.0, 3.0, -1.0])
    logits[0, 2] = torch.tensor([4.0, 9.0, 0.0, 1.0, 2.0, 2.5])
    logits[0, 3] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 7.0])
    logits[1, 2] = torch.tensor([1.0, 6.0, 2.0, 0.0, 4.0, 3.0])
    labels = torch.tensor([[-100, -100, 3, 1], [-100, -100, -100, 2]])
    br = propose_alternatives(logits, labels, 2)
    assert br.positions[0].tolist() == [2, 3] and br.valid.tolist() == [[True, True], [True, False]]
    assert br.positions[1, 0].item() == 3
    assert br.tokens[0].tolist() == [[4, 2], [0, 5]]
    assert br.tokens[1, 0].tolist() == [1, 4]
    e = np.exp
    expected = [
        [e(3) / (e(3) + e(2)), e(2) / (e(3) + e(2))],
        [e(4) / (e(4) + e(2.5)), e(2.5) / (e(4) + e(2.5))],
    ]
    # the proposals are made in float32
    np.testing.assert_allclose(br.weights[0].numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(
        br.weights[1, 0].numpy(), [e(6) / (e(6) + e(4)), e(4) / (e(6) + e(4))], rtol=1e-6
    )
    # an excluded id (the image placeholder) is never proposed
    assert propose_alternatives(logits, labels, 2, exclude=(4,)).tokens[0, 0].tolist() == [2, 1]


def _sharpened(model, factor=10.0):
    """A copy whose language-model attention is sharp (q and k scaled): random-init attention is nearly uniform,
    so positions and masks would barely change the outputs."""
    import copy

    model = copy.deepcopy(model)
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            layer.self_attn.q_proj.weight.mul_(factor)
            layer.self_attn.k_proj.weight.mul_(factor)
    return model


@pytest.fixture(scope="module")
def sharp_models(models):
    tok, teacher, student, batch = models
    return tok, _sharpened(teacher), _sharpened(student), batch


def test_branch_logits_equal_one_forward_per_branch(sharp_models):
    """Each branch token's logits in the one-pass forward equal the model run on ``y_<k, y~_kj`` alone (with the
    row's image): the branch mask and the position ids (branch at position k) together."""
    tok, _teacher, student, batch = sharp_models
    with torch.no_grad():
        plain = student(**{k: v for k, v in batch.items() if k != "labels"}).logits
        br = propose_alternatives(plain, batch["labels"], 2, exclude=(tok.convert_tokens_to_ids("<image>"),))
        s_ext = student(**extend_with_branches(batch, br)).logits
    t_len = batch["input_ids"].shape[1]
    ours = branch_logits(s_ext, t_len, br)
    checked = 0
    with torch.no_grad():
        for b in range(br.positions.shape[0]):
            for r in range(br.positions.shape[1]):
                if not br.valid[b, r]:
                    continue
                k = int(br.positions[b, r])
                for j in range(br.tokens.shape[2]):
                    ids = torch.cat([batch["input_ids"][b, :k], br.tokens[b, r, j : j + 1]])[None]
                    pixels = batch["pixel_values"][b : b + 1]
                    alone = student(input_ids=ids, pixel_values=pixels).logits[0, -1]
                    torch.testing.assert_close(ours[b, r, j], alone, rtol=0, atol=1e-5)
                    checked += 1
    assert checked == 2 * int(br.valid.sum())


@pytest.mark.parametrize("iva_layer", [0, 1])
def test_align_ti_loss_terms_equal_the_plain_forwards_by_hand(sharp_models, iva_layer):
    """The terms of the one-pass (branch-extended) loss against the plain forwards: SFT is the model's own
    shifted cross-entropy (transformers' loss), KD the float64 reference on the next-token logits of the response,
    IVA the float64 reference weighted by the teacher's attention at layer ``iva_layer`` (instruction rows = the
    prompt after BOS, outside image and padding)."""
    tok, teacher, student, batch = sharp_models
    image = tok.convert_tokens_to_ids("<image>")
    loss = AlignTILoss(iva_layer=iva_layer, image_token_id=image, tpa_num_alternatives=2, student_width=16,
                       teacher_width=32)
    with torch.no_grad():  # a projection away from its identity start, so a wrong one shows
        loss.iva_projection.weight.copy_(torch.randn(32, 16, generator=torch.Generator().manual_seed(4)))
    out = loss(student, teacher, batch)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        sft = student(**batch).loss
        s_out = student(**inputs, output_hidden_states=True)
        t_out = teacher(**inputs, output_attentions=True, output_hidden_states=True)
    s = s_out.logits.double().numpy()
    t = t_out.logits.double().numpy()
    ids, labels, valid = batch["input_ids"], batch["labels"], batch["attention_mask"].bool()
    assert float(out["sft"]) == pytest.approx(float(sft), rel=1e-5)
    kd = reference.kd(s[:, :-1], t[:, :-1], (labels[:, 1:] != -100).numpy())
    assert float(out["kd"]) == pytest.approx(kd, rel=1e-4)
    visual = (ids == image) & valid
    instruction = valid & (ids != image) & (labels == -100)
    instruction[:, 0] = False  # BOS
    w = reference.alpha(t_out.attentions[iva_layer].double().numpy(), visual.numpy(), instruction.numpy())
    # IVA: the teacher's input of layer l* (hidden_states[l*]) against the student's input of its layer
    # floor(l* * 1 / 2) = 0, through the projection
    iva = reference.iva_hidden(s_out.hidden_states[0].double().numpy(), t_out.hidden_states[iva_layer].double().numpy(),
                               w, loss.iva_projection.weight.detach().double().numpy())
    assert float(out["iva"]) == pytest.approx(iva, rel=1e-4)
    # the earlier reading (iva_target="logits"): the KL of the LM-head outputs at the image positions
    on_logits = AlignTILoss(iva_layer=iva_layer, image_token_id=image, tpa_weight=0, iva_target="logits")
    assert float(on_logits(student, teacher, batch)["iva"]) == pytest.approx(reference.iva(s, t, w), rel=1e-4)


def test_align_ti_loss_terms_and_gradient(models):
    tok, teacher, student, batch = models
    image = tok.convert_tokens_to_ids("<image>")
    full = AlignTILoss(iva_layer=1, image_token_id=image, student_width=16, teacher_width=32)
    out = full(student, teacher, batch)
    assert set(out) == {"loss", "sft", "kd", "iva", "tpa"} and all(float(out[k].detach()) > 0 for k in out)
    total = out["sft"] + out["kd"] + out["iva"] + out["tpa"]
    assert float(out["loss"].detach()) == pytest.approx(float(total), rel=1e-5)
    # the KD term of the extended pass is the plain vanilla KD
    kd_only = AlignTILoss(iva_weight=0, tpa_weight=0, sft_weight=0)(student, teacher, batch)
    assert float(kd_only["kd"]) == pytest.approx(float(out["kd"]), rel=1e-5)
    student.zero_grad()
    out["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    assert all(p.grad is None for p in teacher.parameters())
    # IVA's projection is trained with the student: it gets a gradient, and it is the loss's only parameter
    assert [p is full.iva_projection.weight for p in full.parameters()] == [True]
    assert full.iva_projection.weight.grad is not None and full.iva_projection.weight.grad.abs().sum() > 0
    # the student is not a teacher of itself: identical models give zero KD, IVA (projection at its identity
    # start) and TPA
    same = AlignTILoss(iva_layer=1, image_token_id=image, student_width=32, teacher_width=32)(teacher, teacher, batch)
    assert all(float(same[k]) == pytest.approx(0.0, abs=1e-6) for k in ("kd", "iva", "tpa"))


def test_bad_input(models):
    tok, teacher, student, batch = models
    image = tok.convert_tokens_to_ids("<image>")
    with pytest.raises(ValueError, match="branch count"):
        build_branch_attention_mask(3, 2, 0)
    with pytest.raises(ValueError, match="branch count"):
        AlignTILoss(tpa_num_alternatives=0, iva_weight=0)
    with pytest.raises(ValueError, match=r"iva_layer must be in 0\.\.1"):
        AlignTILoss(iva_layer=2, image_token_id=image, student_width=16, teacher_width=32)(student, teacher, batch)
    with pytest.raises(ValueError, match="iva_layer and image_token_id"):
        AlignTILoss()
    with pytest.raises(ValueError, match="student_width"):
        AlignTILoss(iva_layer=1, image_token_id=image)
    with pytest.raises(ValueError, match="teacher_width"):
        AlignTILoss(iva_layer=1, image_token_id=image, student_width=16, teacher_width=0)
    with pytest.raises(ValueError, match="iva_target"):
        AlignTILoss(iva_layer=1, image_token_id=image, iva_target="attention")
    with pytest.raises(ValueError, match=r"student_width=32 and teacher_width=16 must be the models' hidden sizes"):
        AlignTILoss(iva_layer=1, image_token_id=image, student_width=32, teacher_width=16, tpa_weight=0)(
            student, teacher, batch)
    with pytest.raises(ValueError, match=r"iva_student_layer must be in 0\.\.0"):
        AlignTILoss(iva_layer=1, image_token_id=image, student_width=16, teacher_width=32, iva_student_layer=1,
                    tpa_weight=0)(student, teacher, batch)
    with pytest.raises(ValueError, match="share a vocabulary"):
        kd_divergence(torch.zeros(1, 2, 5), torch.zeros(1, 2, 6), torch.ones(1, 2, dtype=torch.bool))
    from icml26.common.tiny_vlm import SceneSpec, VLMSpec, tiny_vlm

    class Bigger:
        def convert_tokens_to_ids(self, t):
            return tok.convert_tokens_to_ids(t)

        pad_token_id, bos_token_id, eos_token_id = tok.pad_token_id, tok.bos_token_id, tok.eos_token_id

        def __len__(self):
            return len(tok) + 3

    other = tiny_vlm(Bigger(), VLMSpec(hidden=16, layers=1, intermediate=32), SceneSpec(grid=2), seed=2)
    with pytest.raises(ValueError, match="share a vocabulary"):
        AlignTILoss(iva_weight=0)(other, teacher, batch)
    with pytest.raises(ValueError, match="direction"):
        kd_divergence(
            torch.zeros(1, 2, 5), torch.zeros(1, 2, 5), torch.ones(1, 2, dtype=torch.bool), direction="up"
        )
    with pytest.raises(ValueError, match="NaN or Inf"):
        bad = torch.zeros(1, 1, 5)
        bad[0, 0, 0] = float("nan")
        from icml26.align_ti.loss import _check_finite

        _check_finite("student logits", bad)
    with pytest.raises(ValueError, match="labels"):
        AlignTILoss(iva_weight=0)(student, teacher, {k: v for k, v in batch.items() if k != "labels"})
    with pytest.raises(ValueError, match="eager"):
        sdpa = tiny_vlm(
            tok,
            VLMSpec(hidden=32, layers=2, intermediate=64, attn_implementation="sdpa"),
            SceneSpec(grid=2),
            seed=0,
        )
        AlignTILoss(image_token_id=image, iva_layer=0, tpa_weight=0, student_width=16, teacher_width=32)(
            student, sdpa, batch)
    assert isinstance(Branches, type)


# ------------------------------------------------------------------ a three-layer teacher: l* is not the last layer
@pytest.fixture(scope="module")
def deep():
    """A sharpened 3-layer teacher (so layers differ), a 1-layer student, a batch with answers, and IRS pairs
    (same images, questions about two different patches, answers included as in the reproduction's pairs)."""
    pytest.importorskip("transformers")
    from icml26.common.tiny_vlm import (
        SceneSpec,
        VLMSpec,
        encode,
        item_for,
        make_items,
        render,
        sample_scenes,
        tiny_vlm,
        vlm_tokenizer,
    )

    tok, scenes = vlm_tokenizer(), SceneSpec(grid=2)
    teacher = _sharpened(tiny_vlm(tok, VLMSpec(hidden=32, layers=3, intermediate=64), scenes, seed=5), 6.0).eval()
    student = tiny_vlm(tok, VLMSpec(hidden=16, layers=1, intermediate=32), scenes, seed=6).eval()
    student2 = _sharpened(tiny_vlm(tok, VLMSpec(hidden=16, layers=2, intermediate=32), scenes, seed=7), 6.0).eval()
    rng = np.random.default_rng(1)
    attrs = sample_scenes(scenes, rng, 4)
    batch = encode(tok, make_items(scenes, attrs, rng, ["patch", "count", "object"]), scenes, attrs, rng)
    images = render(scenes, attrs, rng)
    a = [item_for(scenes, attrs[i], "patch", patch=i % 4) for i in range(4)]
    b = [item_for(scenes, attrs[i], "patch", patch=(i + 1) % 4) for i in range(4)]
    pairs = [(encode(tok, a, scenes, None, images=images), encode(tok, b, scenes, None, images=images))]
    return tok, teacher, student, batch, pairs, student2


def _hand_masks(batch, image):
    """Visual tokens, and the instruction: prompt words after BOS, never the image, the answer or padding."""
    ids, valid = batch["input_ids"], batch["attention_mask"].bool()
    visual = (ids == image) & valid
    instruction = valid & (ids != image) & (batch["labels"] == -100)
    instruction[:, 0] = False
    return visual.numpy(), instruction.numpy()


def test_irs_per_layer_matches_the_reference_on_a_three_layer_teacher(deep):
    """IRS(l) for l = 0, 1, 2 in layer order, from the float64 reference on the teacher's own attention maps,
    instruction rows excluding the answer (the pairs carry labels)."""
    tok, teacher, _student, _batch, pairs, _ = deep
    image = tok.convert_tokens_to_ids("<image>")
    ours = instruction_relevance_scores(teacher, pairs, image)
    alphas = []
    for side in (0, 1):
        b = pairs[0][side]
        with torch.no_grad():
            maps = teacher(**{k: v for k, v in b.items() if k != "labels"}, output_attentions=True).attentions
        vis, inst = _hand_masks(b, image)
        alphas.append(
            np.stack([reference.alpha(m.double().numpy(), vis, inst)[vis].reshape(vis.shape[0], -1) for m in maps])
        )
    ref = reference.irs(alphas[0], alphas[1])
    assert ours.shape == (3,)
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-4, atol=1e-7)
    assert len(set(np.round(ref, 6))) == 3  # the layers differ, so an order or layer mix-up shows


@pytest.mark.parametrize("iva_layer", [0, 1, 2])
def test_iva_uses_layer_l_star_of_a_three_layer_teacher(deep, iva_layer):
    """IVA weighted by the teacher's attention at ``iva_layer`` and aligning the teacher's input of that layer (not
    the last layer, not its neighbour), against the float64 reference; the three layers give three different
    values."""
    tok, teacher, student, batch, _pairs, _ = deep
    image = tok.convert_tokens_to_ids("<image>")
    loss = AlignTILoss(iva_layer=iva_layer, image_token_id=image, tpa_weight=0, student_width=16, teacher_width=32)
    out = loss(student, teacher, batch)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        s = student(**inputs, output_hidden_states=True).hidden_states[0].double().numpy()
        t_out = teacher(**inputs, output_attentions=True, output_hidden_states=True)
    vis, inst = _hand_masks(batch, image)
    proj = np.eye(32, 16)
    values = [
        reference.iva_hidden(s, t_out.hidden_states[i].double().numpy(),
                             reference.alpha(m.double().numpy(), vis, inst), proj)
        for i, m in enumerate(t_out.attentions)
    ]
    assert float(out["iva"]) == pytest.approx(values[iva_layer], rel=1e-5)
    assert min(abs(values[i] - values[j]) for i, j in ((0, 1), (0, 2), (1, 2))) > 1e-4 * max(values)


def test_only_layer_l_star_attention_is_taken(deep):
    """The loss's teacher forward asks for no attention maps (``output_attentions`` unset): layer l*'s map comes
    from a hook on its attention module and equals what ``output_attentions=True`` returns for that layer."""
    from icml26.align_ti.loss import _forward_with_attention

    tok, teacher, student, batch, _pairs, _ = deep
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        full = teacher(**inputs, output_attentions=True)
        for layer in range(3):
            out, attn = _forward_with_attention(teacher, inputs, layer)
            assert torch.equal(attn, full.attentions[layer])
            assert torch.equal(out.logits, full.logits) and out.attentions is None
    seen = []
    hook = teacher.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw.get("output_attentions")), with_kwargs=True
    )
    try:
        AlignTILoss(iva_layer=1, image_token_id=tok.convert_tokens_to_ids("<image>"), student_width=16,
                    teacher_width=32)(student, teacher, batch)
    finally:
        hook.remove()
    assert seen == [None]


@pytest.mark.parametrize("iva_layer", [0, 1, 2])
def test_iva_aligns_the_student_layer_at_the_same_relative_depth(deep, iva_layer):
    """A 2-layer student under a 3-layer teacher: IVA aligns the student's input of layer floor(l* 2 / 3) = 0, 0, 1
    (``hidden_states[s]``) with the teacher's input of l*, at the image positions the teacher's l* attention
    weights, through the projection; ``iva_student_layer`` overrides s. Against the float64 reference."""
    tok, teacher, _student, batch, _pairs, student2 = deep
    image = tok.convert_tokens_to_ids("<image>")
    proj = torch.randn(32, 16, generator=torch.Generator().manual_seed(9))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        s_hs = student2(**inputs, output_hidden_states=True).hidden_states
        t_out = teacher(**inputs, output_attentions=True, output_hidden_states=True)
    vis, inst = _hand_masks(batch, image)
    w = reference.alpha(t_out.attentions[iva_layer].double().numpy(), vis, inst)
    t = t_out.hidden_states[iva_layer].double().numpy()
    ref = [reference.iva_hidden(s_hs[k].double().numpy(), t, w, proj.double().numpy()) for k in (0, 1)]
    assert abs(ref[0] - ref[1]) > 1e-3 * max(ref)  # the two student layers differ, so a wrong one shows
    for s_layer, expected in ((None, [0, 0, 1][iva_layer]), (0, 0), (1, 1)):
        loss = AlignTILoss(iva_layer=iva_layer, image_token_id=image, tpa_weight=0, student_width=16,
                           teacher_width=32, iva_student_layer=s_layer)
        with torch.no_grad():
            loss.iva_projection.weight.copy_(proj)
        assert float(loss(student2, teacher, batch)["iva"]) == pytest.approx(ref[expected], rel=1e-5), s_layer


def test_ivas_projection_starts_at_the_identity_embedding_without_a_random_draw():
    """``P`` starts at ``eye(teacher_width, student_width)`` (identical models start at IVA 0) and building the loss
    draws nothing from torch's global random state (the reproduction's other draws stay where they were)."""
    state = torch.random.get_rng_state()
    loss = AlignTILoss(iva_layer=0, image_token_id=4, student_width=3, teacher_width=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(loss.iva_projection.weight.detach(), torch.eye(5, 3))
    assert loss.iva_projection.bias is None and loss.iva_projection.weight.requires_grad
    # without IVA on hidden states the loss holds no parameter
    assert list(AlignTILoss(iva_layer=0, image_token_id=4, iva_target="logits").parameters()) == []
    assert list(AlignTILoss(iva_weight=0).parameters()) == []
