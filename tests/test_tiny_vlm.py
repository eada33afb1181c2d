"""The vision-language lab: scenes, questions, MMVP pairs, tokenizer, the real LLaVA, batches, scores (against HF
generation), training, the from_pretrained path and the cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from icml26.common import tiny_vlm
from icml26.common.tiny_vlm import (
    COLORS,
    SHAPES,
    LabRecipe,
    SceneSpec,
    VLMSpec,
    cached_vlm,
    encode,
    encoder_for,
    instruction_sampler,
    item_for,
    lab_vlm,
    load_vlm,
    make_items,
    mmvp_pairs,
    probe_encoder,
    render,
    sample_scenes,
    save_vlm,
    score_items,
    train_vlm,
    trainable_parameters,
    vlm_tokenizer,
)
from icml26.common.tiny_vlm import (
    tiny_vlm as build_vlm,
)

SPEC = SceneSpec(grid=2)
SMALL = VLMSpec(hidden=32, layers=1, heads=2, intermediate=64, vision_hidden=16, vision_heads=2)


@pytest.fixture(scope="module")
def tok():
    return vlm_tokenizer()


def test_render_puts_each_object_in_its_half_of_its_patch():
    spec = SceneSpec(grid=2, noise=0.0, jitter=False)
    attrs = sample_scenes(spec, np.random.default_rng(0), 5)
    img = render(spec, attrs, np.random.default_rng(0)) + 0.5  # (n, 3, 16, 16), uncentred
    rgb = tiny_vlm._RGB
    for n in range(5):
        for p in range(4):
            r, c = divmod(p, 2)
            for side in range(2):
                block = img[n, :, 8 * r: 8 * r + 8, 8 * c + 4 * side: 8 * c + 4 * side + 4]
                lit = block.reshape(3, -1)[:, block.sum(0).ravel() > 0]
                assert lit.shape[1] == tiny_vlm._SPRITES[attrs[n, p, side, 1]].sum()  # the shape's pixel count
                np.testing.assert_allclose(lit.T, np.broadcast_to(rgb[attrs[n, p, side, 0]], lit.T.shape))


def test_render_is_deterministic_and_checks_shapes():
    attrs = sample_scenes(SPEC, np.random.default_rng(1), 3)
    a = render(SPEC, attrs, np.random.default_rng(2))
    np.testing.assert_array_equal(a, render(SPEC, attrs, np.random.default_rng(2)))
    assert a.dtype == np.float32 and a.shape == (3, 3, 16, 16)
    with pytest.raises(ValueError, match="attrs must have shape"):
        render(SPEC, attrs[:, :3], np.random.default_rng(0))
    with pytest.raises(ValueError, match="grid"):
        SceneSpec(grid=5)
    with pytest.raises(ValueError, match="patch"):
        SceneSpec(patch=6)


def test_items_answer_what_they_ask():
    attrs = sample_scenes(SPEC, np.random.default_rng(3), 200)
    items = make_items(SPEC, attrs, np.random.default_rng(4), ["attribute", "object", "patch", "count", "caption"])
    assert {it.family for it in items} == {"attribute", "object", "patch", "count", "caption"}
    for scene, it in zip(attrs, items, strict=True):
        if it.family == "attribute":
            words = it.prompt.split()
            side, patch = ("left", "right").index(words[4]), int(words[-1])
            value = scene[patch, side, it.attribute]
            assert it.answer == (COLORS if words[1] == "color" else SHAPES)[value]
            assert it.entangled == (scene[patch, 1 - side, it.attribute] != value)
        elif it.family == "count":
            colour = COLORS.index(it.prompt.split()[2])
            assert int(it.answer) == int((scene[:, :, 0] == colour).sum())
        elif it.family == "patch":
            p = int(it.prompt.split()[-1])
            assert it.answer.split() == [COLORS[scene[p, 0, 0]], SHAPES[scene[p, 0, 1]], "and",
                                         COLORS[scene[p, 1, 0]], SHAPES[scene[p, 1, 1]]]
    with pytest.raises(ValueError, match="family"):
        make_items(SPEC, attrs, np.random.default_rng(0), "poem")


def test_mmvp_pairs_differ_in_the_asked_attribute_only():
    scenes, items = mmvp_pairs(SPEC, np.random.default_rng(5), 50)
    for k in range(50):
        a, b = scenes[2 * k], scenes[2 * k + 1]
        ia, ib = items[2 * k], items[2 * k + 1]
        assert ia.prompt == ib.prompt and ia.answer != ib.answer
        diff = np.argwhere(a != b)
        assert diff.tolist() == [[ia.patch, ia.side, ia.attribute]]


def test_tokenizer_and_encode_layout(tok):
    item = item_for(SPEC, sample_scenes(SPEC, np.random.default_rng(6), 1)[0], "object", patch=2, side=1)
    ids = tok(item.prompt + " " + item.answer, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == item.prompt + " " + item.answer
    attrs = sample_scenes(SPEC, np.random.default_rng(7), 2)
    items = [item, item_for(SPEC, attrs[1], "attribute", patch=0, side=0, attribute=1)]
    b = encode(tok, items, SPEC, attrs, np.random.default_rng(8))
    image = tok.convert_tokens_to_ids("<image>")
    assert (b["input_ids"][:, 1:5] == image).all() and (b["input_ids"][:, 0] == tok.bos_token_id).all()
    n_prompt = 1 + 4 + len(item.prompt.split())
    assert (b["labels"][0, :n_prompt] == -100).all()
    answer = [*tok.convert_tokens_to_ids(item.answer.split()), tok.eos_token_id]
    assert b["labels"][0, n_prompt:].tolist() == answer + [-100] * (b["labels"].shape[1] - n_prompt - len(answer))
    assert b["attention_mask"][1].sum() == 1 + 4 + len(items[1].prompt.split()) + 2
    with pytest.raises(ValueError, match="outside the lab vocabulary"):
        encode(tok, [item.__class__("what is love", "baby", "attribute")], SPEC, attrs[:1], np.random.default_rng(0))


def test_model_is_a_real_llava_and_seeded(tok):
    a, b = build_vlm(tok, SMALL, SPEC, seed=3), build_vlm(tok, SMALL, SPEC, seed=3)
    assert type(a).__name__ == "LlavaForConditionalGeneration"
    batch = encode(tok, make_items(SPEC, sample_scenes(SPEC, np.random.default_rng(0), 2), np.random.default_rng(0),
                                   "attribute"), SPEC, sample_scenes(SPEC, np.random.default_rng(0), 2),
                   np.random.default_rng(0))
    torch.testing.assert_close(a(**batch).logits, b(**batch).logits)


def test_exact_match_equals_greedy_generation(tok):
    """Teacher-forced exact match == "greedy decoding returns the answer and stops" (checked with HF generate)."""
    model = build_vlm(tok, SMALL, SPEC, seed=4)
    rng = np.random.default_rng(9)
    attrs = sample_scenes(SPEC, rng, 24)
    items = make_items(SPEC, attrs, rng, ["attribute", "object"])
    images = render(SPEC, attrs, rng)
    # make some answers right: train briefly on these very items
    batch = encode(tok, items, SPEC, None, images=images)
    opt = torch.optim.Adam(trainable_parameters(model, "projector+lm"), lr=1e-2)
    for _ in range(40):
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    exact, token = score_items(model, batch)
    assert 0 < exact.sum() < len(items)
    prompts = encode(tok, items, SPEC, None, images=images, with_answer=False)
    for i, it in enumerate(items):
        n = int(prompts["attention_mask"][i].sum())
        out = model.generate(input_ids=prompts["input_ids"][i: i + 1, :n], pixel_values=prompts["pixel_values"][i: i + 1],
                             attention_mask=prompts["attention_mask"][i: i + 1, :n], max_new_tokens=4,
                             do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, n:], skip_special_tokens=False).split()
        greedy_right = text[: len(it.answer.split()) + 1] == [*it.answer.split(), "</s>"]
        assert bool(exact[i]) == greedy_right
    assert np.all(token >= exact)


def test_training_is_deterministic_and_freezes_the_tower(tok):
    def trained():
        model = build_vlm(tok, SMALL, SPEC, seed=5)
        tower = {k: v.clone() for k, v in model.model.vision_tower.state_dict().items()}
        train_vlm(model, instruction_sampler(tok, SPEC, "attribute", 8), steps=3, seed=1, desc=None)
        for k, v in model.model.vision_tower.state_dict().items():
            torch.testing.assert_close(v, tower[k])
        return model

    a, b = trained(), trained()
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(v, w, msg=k)
    with pytest.raises(ValueError, match="trainable"):
        trainable_parameters(a, "everything")
    names = {n for n, p in a.named_parameters() if p in set(trainable_parameters(a, "projector"))}
    assert names and all("multi_modal_projector" in n for n in names)


def test_encoder_pretraining_makes_patch_tokens_readable(tok):
    model = build_vlm(tok, SMALL, SPEC, seed=6)
    before = probe_encoder(model, SPEC, n_train=300, n_test=100)
    tiny_vlm.pretrain_encoder(model, SPEC, steps=60, batch_size=32)
    after = probe_encoder(model, SPEC, n_train=300, n_test=100)
    assert after > max(before, 0.6)
    assert not any(p.requires_grad for p in model.model.vision_tower.parameters())


def test_encoder_pretraining_ignores_the_global_rng(tok):
    """The same seed gives the same encoder whatever the process drew before (the cached lab encoder is keyed by
    its seed alone, so a build that read the global RNG made one key name several different encoders)."""
    def pretrained(global_seed):
        model = build_vlm(tok, SMALL, SPEC, seed=6)
        torch.manual_seed(global_seed)
        tiny_vlm.pretrain_encoder(model, SPEC, steps=2, batch_size=8, seed=3)
        return model.model.vision_tower.state_dict()

    a, b = pretrained(1), pretrained(2)
    for k, v in a.items():
        torch.testing.assert_close(v, b[k], rtol=0, atol=0, msg=k)


def test_save_from_pretrained_and_cache(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("ICML26_CACHE", str(tmp_path / "cache"))
    model = build_vlm(tok, SMALL, SPEC, seed=7)
    save_vlm(model, tok, tmp_path / "m")
    loaded, tok2 = load_vlm(tmp_path / "m")
    batch = encode(tok2, make_items(SPEC, sample_scenes(SPEC, np.random.default_rng(1), 2), np.random.default_rng(1),
                                    "patch"), SPEC, sample_scenes(SPEC, np.random.default_rng(1), 2),
                   np.random.default_rng(1))
    torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits)
    calls = []

    def build():
        calls.append(1)
        return build_vlm(tok, SMALL, SPEC, seed=8), tok

    m1, _ = cached_vlm({"k": 1}, build)
    m2, _ = cached_vlm({"k": 1}, build)
    assert len(calls) == 1
    torch.testing.assert_close(m1(**batch).logits, m2(**batch).logits)
    cached_vlm({"k": 2}, build)
    assert len(calls) == 2
    with pytest.raises(FileNotFoundError):
        load_vlm(tmp_path / "nothing")


def test_lab_recipe_caches_and_shares_the_encoder(tmp_path, monkeypatch):
    monkeypatch.setenv("ICML26_CACHE", str(tmp_path / "cache"))
    small = LabRecipe(scenes=SPEC, spec=SMALL, encoder_steps=5, stage1_steps=3, batch_size=8)
    bigger = LabRecipe(scenes=SPEC, spec=VLMSpec(hidden=48, layers=2, heads=2, intermediate=96, vision_hidden=16,
                                                  vision_heads=2), encoder_steps=5, stage1_steps=3, batch_size=8)
    student, _ = lab_vlm(small, desc=None)
    teacher, _ = lab_vlm(bigger, desc=None)
    for (k, v), w in zip(student.model.vision_tower.state_dict().items(),
                         teacher.model.vision_tower.state_dict().values(), strict=True):
        torch.testing.assert_close(v, w, msg=k)
    for k, v in encoder_for(small).items():
        torch.testing.assert_close(student.model.vision_tower.state_dict()[k], v)
    again, _ = lab_vlm(small, desc=None)
    for v, w in zip(student.state_dict().values(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(v, w)
    assert len(list((tmp_path / "cache" / "tiny_vlm").iterdir())) == 3  # one encoder, two models


def test_segment_masks_and_custom_losses(tok):
    attrs = sample_scenes(SPEC, np.random.default_rng(10), 3)
    items = make_items(SPEC, attrs, np.random.default_rng(11), ["attribute", "patch"])
    b = encode(tok, items, SPEC, attrs, np.random.default_rng(12))
    seg = tiny_vlm.segment_masks(tok, b)
    for i, it in enumerate(items):
        assert int(seg["image"][i].sum()) == 4
        assert int(seg["instruction"][i].sum()) == len(it.prompt.split())
        assert int(seg["answer"][i].sum()) == len(it.answer.split()) + 1
    total = seg["image"].long() + seg["instruction"].long() + seg["answer"].long() + seg["pad"].long()
    assert (total[:, 1:] == 1).all() and (total[:, 0] == 0).all()  # <s> is in none
    model = build_vlm(tok, SMALL, SPEC, seed=9)
    seen = []

    def loss_fn(m, batch):
        seen.append(batch["input_ids"].shape[0])
        return m(**batch).loss * 0.0 + m.lm_head.weight.pow(2).mean()

    train_vlm(model, instruction_sampler(tok, SPEC, "object", 4), steps=2, loss_fn=loss_fn, desc=None)
    assert seen == [4, 4]


def test_grid_recipe_item_ids_and_the_recording_sampler(tok):
    from icml26.common.tiny_vlm import grid_recipe, item_id, item_ids, recording_sampler

    explicit = LabRecipe(scenes=SceneSpec(grid=3), spec=VLMSpec(hidden=48, layers=2, heads=4, intermediate=96,
                                                                attn_implementation="sdpa"),
                         stage1_steps=7, batch_size=16, seed=2)
    made = grid_recipe(3, 48, 2, attn_implementation="sdpa", stage1_steps=7, batch_size=16, seed=2)
    assert made == explicit and made.key() == explicit.key()
    assert grid_recipe(2, 64, 1).spec.attn_implementation == VLMSpec().attn_implementation
    spec = SceneSpec(grid=2)
    attrs = sample_scenes(spec, np.random.default_rng(0), 4)
    items = make_items(spec, attrs, np.random.default_rng(1), "attribute")
    ids = item_ids(attrs, items)
    assert ids[0] == item_id(attrs[0], items[0].prompt) and len(set(ids)) == 4 and len(ids[0]) == 12
    assert item_id(attrs[0], items[0].prompt) != item_id(attrs[1], items[0].prompt)
    record: set[str] = set()
    plain = instruction_sampler(tok, spec, "attribute", 4)(np.random.default_rng(5))
    recorded = recording_sampler(tok, spec, "attribute", 4, record)(np.random.default_rng(5))
    for k in plain:
        assert torch.equal(plain[k], recorded[k]), k  # the same draws in the same order
    rng = np.random.default_rng(5)
    a = sample_scenes(spec, rng, 4)
    assert record == set(item_ids(a, make_items(spec, a, rng, "attribute")))
