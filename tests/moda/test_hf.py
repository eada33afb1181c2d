"""attach_moda on a real (tiny, random) transformers LLaVA: instruction selection, save / from_pretrained, PEFT
``modules_to_save``, the HF Trainer, generation; bad input."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from icml26.moda import MoDAAdapter, attach_moda, detach_moda, from_pretrained_with_moda, get_moda  # noqa: E402
from icml26.moda.hf import instruction_embeddings  # noqa: E402

IMAGE, PAD, VOCAB, E = 39, 0, 40, 32


def tiny_llava(seed=0):
    tf = transformers
    cfg = tf.LlavaConfig(
        vision_config=tf.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, image_size=16, patch_size=8,
                                            vision_use_head=False),
        text_config=tf.LlamaConfig(vocab_size=VOCAB, hidden_size=E, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, pad_token_id=PAD),
        image_token_id=IMAGE, image_seq_length=4, vision_feature_layer=-1, vision_feature_select_strategy="full")
    torch.manual_seed(seed)
    return tf.LlavaForConditionalGeneration(cfg).eval()


def moda(seed=1):
    torch.manual_seed(seed)
    return MoDAAdapter(E, num_heads=4, num_layers=2, ff_dim=8).eval()


def batch():
    # row 0: <s> img x4 prompt(5 6 7) answer(8 9) ; row 1: <s> img x4 prompt(10 11) answer(12) pad
    ids = torch.tensor([[1, *[IMAGE] * 4, 5, 6, 7, 8, 9], [1, *[IMAGE] * 4, 10, 11, 12, PAD, PAD]])
    att = (ids != PAD).long()
    labels = torch.full_like(ids, -100)
    labels[0, 8:] = ids[0, 8:]
    labels[1, 7] = 12
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": att, "labels": labels, "pixel_values": pixels}


class Spy(torch.nn.Module):
    """Records what the hook passes to the adapter; returns the visual tokens unchanged."""

    embed_dim = E

    def forward(self, visual, text, pad):
        self.seen = (visual.detach(), text.detach(), pad)
        return visual


def test_the_adapter_sees_prompt_tokens_only_with_a_padding_mask():
    model = tiny_llava()
    spy = Spy()
    attach_moda(model, spy)
    b = batch()
    model(**b)
    _, text, pad = spy.seen
    emb = model.get_input_embeddings()
    # labels given: <s> and the prompt (not the image, not the answer, not padding)
    expected = [[1, 5, 6, 7], [1, 10, 11]]
    assert pad.tolist() == [[False] * 4, [False, False, False, True]]
    for row, ids in enumerate(expected):
        torch.testing.assert_close(text[row, : len(ids)], emb(torch.tensor(ids)).detach())
    # no labels (inference): every non-image, non-padding token
    model(**{k: v for k, v in b.items() if k != "labels"})
    _, text, pad = spy.seen
    assert pad.tolist() == [[False] * 6, [False] * 4 + [True] * 2]
    torch.testing.assert_close(text[0], emb(torch.tensor([1, 5, 6, 7, 8, 9])).detach())


def test_the_response_never_reaches_the_gate():
    """Changing the answer tokens (labelled) leaves the modulated visual tokens unchanged."""
    model = attach_moda(tiny_llava(), moda())
    b = batch()
    model(**b)
    first = get_moda(model).last_mask.clone()
    b2 = {k: v.clone() for k, v in b.items()}
    b2["input_ids"][0, 8:] = torch.tensor([20, 21])
    b2["labels"][0, 8:] = torch.tensor([20, 21])
    model(**b2)
    torch.testing.assert_close(get_moda(model).last_mask, first)


def test_moda_changes_the_output_and_equals_manual_modulation():
    base = tiny_llava()
    b = batch()
    plain = base(**b).logits
    adapter = moda()
    model = attach_moda(tiny_llava(), adapter)
    out = model(**b).logits
    assert not torch.allclose(out, plain)
    # the same forward by hand: modulate the projector's output, then run LLaVA on inputs_embeds
    inner = model.model
    with torch.no_grad():
        feats = inner.vision_tower(b["pixel_values"], output_hidden_states=True).hidden_states[-1]
        proj = base.model.multi_modal_projector(feats)
        text, pad = instruction_embeddings(model, b["input_ids"], b["attention_mask"], b["labels"])
        modulated = adapter(proj, text, pad)
        embeds = inner.get_input_embeddings()(b["input_ids"])
        embeds = embeds.masked_scatter((b["input_ids"] == IMAGE)[..., None], modulated)
        manual = base(inputs_embeds=embeds, attention_mask=b["attention_mask"]).logits
    torch.testing.assert_close(out, manual)


def test_save_and_from_pretrained_round_trip(tmp_path):
    model = attach_moda(tiny_llava(), moda())
    b = batch()
    before = model(**b).logits
    model.save_pretrained(tmp_path / "m")
    loaded = from_pretrained_with_moda(tmp_path / "m").eval()
    torch.testing.assert_close(loaded(**b).logits, before)
    assert loaded.config.moda == get_moda(model).config_dict()
    # a plain from_pretrained gives LLaVA without the adapter
    plain = transformers.LlavaForConditionalGeneration.from_pretrained(tmp_path / "m", local_files_only=True)
    assert not hasattr(plain.model, "moda")
    with pytest.raises(ValueError, match="no 'moda' entry"):
        tiny_llava().save_pretrained(tmp_path / "base")
        from_pretrained_with_moda(tmp_path / "base")


def test_peft_modules_to_save_trains_and_reloads(tmp_path):
    peft = pytest.importorskip("peft")
    model = attach_moda(tiny_llava(), moda())
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["moda"])
    wrapped = peft.get_peft_model(model, config)
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert any("moda" in n and "modules_to_save" in n for n in trainable)
    assert any("lora_" in n for n in trainable)
    b = batch()
    opt = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-2)
    wrapped.train()
    loss = wrapped(**b).loss
    loss.backward()
    opt.step()
    wrapped.eval()
    after = wrapped(**b).logits
    wrapped.save_pretrained(tmp_path / "adapter")
    fresh = attach_moda(tiny_llava(), moda())
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    torch.testing.assert_close(reloaded(**b).logits, after)


def test_hf_trainer_runs_a_step(tmp_path):
    from datasets import Dataset

    model = attach_moda(tiny_llava(), moda())
    b = batch()
    rows = [{k: v[i].tolist() for k, v in b.items()} for i in range(2)] * 2
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
                                          max_steps=2, learning_rate=1e-2, report_to=[], use_cpu=True,
                                          save_strategy="no", logging_strategy="no", remove_unused_columns=False)

    def collate(items):
        return {k: torch.tensor([it[k] for it in items], dtype=torch.float32 if k == "pixel_values" else torch.long)
                for k in items[0]}

    before = get_moda(model).mask_head.weight.detach().clone()
    transformers.Trainer(model=model, args=args, train_dataset=Dataset.from_list(rows), data_collator=collate).train()
    assert not torch.allclose(get_moda(model).mask_head.weight, before)


def test_generate_uses_the_adapter_on_the_prompt():
    model = attach_moda(tiny_llava(), moda())
    b = batch()
    prompt = b["input_ids"][:1, :8]
    out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), pixel_values=b["pixel_values"][:1],
                         max_new_tokens=3, do_sample=False, pad_token_id=PAD)
    assert out.shape == (1, 11)
    assert get_moda(model).last_mask.shape == (1, 4, E)


def test_several_images_per_row_get_their_rows_instruction():
    model = tiny_llava()
    spy = Spy()
    attach_moda(model, spy)
    ids = torch.tensor([[1, *[IMAGE] * 4, 5, *[IMAGE] * 4, 6], [1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])
    ids[1, 1:5] = IMAGE
    pixels = torch.randn(3, 3, 16, 16)
    model(input_ids=ids, pixel_values=pixels)
    _, text, _ = spy.seen
    assert text.shape[0] == 3
    torch.testing.assert_close(text[0], text[1])
    assert not torch.allclose(text[1, :3], text[2, :3])


def test_detach_restores_the_plain_model():
    model = tiny_llava()
    b = batch()
    plain = model(**b).logits
    attach_moda(model, moda())
    detach_moda(model)
    torch.testing.assert_close(model(**b).logits, plain)
    assert not hasattr(model.config, "moda")


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_attachments_are_refused():
    with pytest.raises(ValueError, match="embed_dim=16 differs"):
        attach_moda(tiny_llava(), MoDAAdapter(16, num_heads=4))
    model = attach_moda(tiny_llava(), moda())
    with pytest.raises(ValueError, match="already has"):
        attach_moda(model, moda())
    with pytest.raises(TypeError, match="multi_modal_projector"):
        attach_moda(torch.nn.Linear(2, 2), moda())
    with pytest.raises(TypeError, match=r"nn\.Module"):
        attach_moda(tiny_llava(), lambda v, t, p: v)
    with pytest.raises(ValueError, match="text_source"):
        attach_moda(tiny_llava(), moda(), text_source="all")
    with pytest.raises(ValueError, match="no MoDA adapter"):
        detach_moda(tiny_llava())


def test_empty_instructions_and_missing_ids_are_refused():
    model = attach_moda(tiny_llava(), moda())
    b = batch()
    labels = b["input_ids"].clone()  # everything labelled: no prompt token left
    with pytest.raises(ValueError, match="empty instruction"):
        model(**{**b, "labels": labels})
    embeds = model.get_input_embeddings()(b["input_ids"])
    with pytest.raises(ValueError, match="needs input_ids"):
        model(inputs_embeds=embeds, pixel_values=b["pixel_values"], attention_mask=b["attention_mask"])
    with pytest.raises(RuntimeError, match="outside the model's forward"):
        model.model.get_image_features(pixel_values=b["pixel_values"])


# ------------------------------------------------------------------------ issue #54: template, dtype, LLaVA-NeXT
TEMPLATE = (30, 31)  # "ASSISTANT :" of this vocabulary


def templated_batch(answers=((8, 9), (12,))):
    """Rows ``<s> img x4 prompt ASSISTANT : answer``, right-padded; labels on the answers."""
    rows = [[1, *[IMAGE] * 4, 5, 6, *TEMPLATE, *answers[0]], [1, *[IMAGE] * 4, 10, *TEMPLATE, *answers[1]]]
    width = max(map(len, rows))
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    labels = torch.full_like(ids, -100)
    labels[0, 9:9 + len(answers[0])] = torch.tensor(answers[0])
    labels[1, 8:8 + len(answers[1])] = torch.tensor(answers[1])
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(), "labels": labels, "pixel_values": pixels}


def test_without_labels_the_template_keeps_the_answer_from_the_gate():
    """With ``response_template``, a forward without labels gives the gate exactly the prompt (through the
    template): changing the answer tokens changes neither the text the adapter sees nor the gate."""
    spy = Spy()
    model = attach_moda(tiny_llava(), spy, response_template=TEMPLATE)
    b = templated_batch()
    model(**{k: v for k, v in b.items() if k != "labels"})
    _, text, pad = spy.seen
    emb = model.get_input_embeddings()
    assert pad.tolist() == [[False] * 5, [False] * 4 + [True]]
    torch.testing.assert_close(text[0], emb(torch.tensor([1, 5, 6, *TEMPLATE])).detach())
    torch.testing.assert_close(text[1, :4], emb(torch.tensor([1, 10, *TEMPLATE])).detach())

    model = attach_moda(tiny_llava(), moda(), response_template=TEMPLATE)
    gates = []
    for answers in (((8, 9), (12,)), ((20, 21), (22,))):
        b = templated_batch(answers)
        for with_labels in (False, True):
            model(**{k: v for k, v in b.items() if with_labels or k != "labels"})
            gates.append(get_moda(model).last_mask.detach().clone())
    for g in gates[1:]:
        torch.testing.assert_close(g, gates[0], rtol=0, atol=0)
    # without the template the answer does reach the gate of an unlabelled call (the documented limit)
    plain = attach_moda(tiny_llava(), moda())
    seen = []
    for answers in (((8, 9), (12,)), ((20, 21), (22,))):
        plain(**{k: v for k, v in templated_batch(answers).items() if k != "labels"})
        seen.append(get_moda(plain).last_mask.detach().clone())
    assert not torch.equal(seen[0], seen[1])


def test_after_response_template_by_hand():
    from icml26.moda.hf import after_response_template

    ids = torch.tensor([[1, 30, 31, 4, 30, 31, 5, 6], [1, 2, 30, 3, 31, 4, 5, 0], [1, 2, 3, 30, 31, 0, 0, 0]])
    valid = torch.tensor([[1] * 8, [1] * 7 + [0], [1] * 5 + [0] * 3])
    got = after_response_template(ids, TEMPLATE, valid).int().tolist()
    # the last occurrence counts; a split template is no template; a template at the end leaves nothing after
    assert got == [[0, 0, 0, 0, 0, 0, 1, 1], [0] * 8, [0, 0, 0, 0, 0, 1, 1, 1]]
    assert after_response_template(ids[:, :1], TEMPLATE).int().tolist() == [[0], [0], [0]]


def test_template_survives_save_and_from_pretrained(tmp_path):
    model = attach_moda(tiny_llava(), moda(), response_template=TEMPLATE)
    model.save_pretrained(tmp_path)
    again = from_pretrained_with_moda(tmp_path).eval()
    assert list(again.config.moda_response_template) == list(TEMPLATE)
    b = templated_batch()
    inputs = {k: v for k, v in b.items() if k != "labels"}
    torch.testing.assert_close(again(**inputs).logits, model(**inputs).logits)
    detach_moda(again)
    assert not hasattr(again.config, "moda_response_template")


def test_bf16_model_gets_a_bf16_adapter():
    """A float32 adapter attached to a bfloat16 LLaVA is moved to bfloat16: forward (with the loss) and backward
    work, and the adapter's parameters and gradients are bfloat16."""
    model = tiny_llava().to(torch.bfloat16)
    adapter = moda()
    attach_moda(model, adapter)
    assert get_moda(model) is adapter
    assert {p.dtype for p in get_moda(model).parameters()} == {torch.bfloat16}
    b = batch()
    out = model(**b)
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in get_moda(model).parameters())
    text, pad = instruction_embeddings(model, b["input_ids"], b["attention_mask"], b["labels"])
    assert text.dtype == torch.bfloat16 and pad.shape == text.shape[:2]


def test_llava_next_is_refused_with_a_message_that_names_what_works():
    tf = transformers
    cfg = tf.LlavaNextConfig(
        vision_config=tf.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, image_size=16, patch_size=8),
        text_config=tf.LlamaConfig(vocab_size=VOCAB, hidden_size=E, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, pad_token_id=PAD),
        image_token_index=IMAGE, image_grid_pinpoints=[[16, 16], [16, 32]], vision_feature_layer=-1)
    torch.manual_seed(0)
    with pytest.raises(TypeError, match="LlavaNextForConditionalGeneration is not supported"):
        attach_moda(tf.LlavaNextForConditionalGeneration(cfg), moda())
    with pytest.raises(TypeError, match=r"LLaVA-1\.5-style") as err:
        attach_moda(torch.nn.Linear(2, 2), moda())
    assert "LlavaNext" not in str(err.value)


def test_bad_response_templates_are_refused():
    with pytest.raises(ValueError, match="response_template is empty"):
        attach_moda(tiny_llava(), moda(), response_template=())
    with pytest.raises(TypeError, match="response_template"):
        attach_moda(tiny_llava(), moda(), response_template="ASSISTANT:")
    with pytest.raises(TypeError, match="response_template"):
        attach_moda(tiny_llava(), moda(), response_template=[30, 1.5])
