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
