"""The mixed LoRA layer against float64 loops, gradcheck and peft (a peer library); real transformers models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml26.fedtreelora import reference as ref
from icml26.fedtreelora.module import (
    MixedLoRALinear,
    export_peft,
    from_peft_model,
    from_peft_state_dict,
    get_lora_state,
    inject_mixed_lora,
    lora_keys,
    lora_modules,
    set_lora_state,
    to_peft_state_dict,
)

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def _tiny_llama(seed=0):
    from icml26.common.tiny_lm import tiny_causal_lm

    return tiny_causal_lm(32, hidden=16, layers=2, heads=2, kv_heads=1, intermediate=32, max_positions=16, seed=seed)


def _randomize(model, seed=0, ext=False):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_modules(model).values():
            m.lora_A.normal_(generator=g)
            m.lora_B.normal_(generator=g)
            if ext:
                m.set_external(torch.randn(m.ext_A.shape, generator=g), torch.randn(m.ext_B.shape, generator=g))
                m.mix_logit.fill_(0.7)


def test_forward_matches_the_float64_loops():
    torch.manual_seed(0)
    layer = MixedLoRALinear(torch.nn.Linear(5, 4), r=3, alpha=6.0, seed=1).double()
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(7, 5, dtype=torch.float64)
    W0, b0 = layer.base.weight.detach().numpy(), layer.base.bias.detach().numpy()
    A, B = layer.lora_A.detach().numpy(), layer.lora_B.detach().numpy()
    np.testing.assert_allclose(layer(x).detach().numpy(),
                               ref.mixed_lora_forward(x.numpy(), W0, b0, A, B, None, None, 0.0, 6.0), atol=1e-12)
    Ae, Be = np.random.default_rng(0).normal(size=A.shape), np.random.default_rng(1).normal(size=B.shape)
    layer.set_external(Ae, Be)
    with torch.no_grad():
        layer.mix_logit.fill_(-0.4)
    np.testing.assert_allclose(layer(x).detach().numpy(),
                               ref.mixed_lora_forward(x.numpy(), W0, b0, A, B, Ae, Be, -0.4, 6.0), atol=1e-12)
    assert layer.mix == pytest.approx(1 / (1 + np.exp(0.4)))


def test_gradients_pass_gradcheck():
    layer = MixedLoRALinear(torch.nn.Linear(4, 3), r=2, alpha=4.0, seed=0).double()
    layer.set_external(torch.randn(2, 4, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64))
    x = torch.randn(5, 4, dtype=torch.float64)

    def f(A, B, logit):
        with torch.no_grad():
            layer.lora_A.copy_(A)
            layer.lora_B.copy_(B)
            layer.mix_logit.copy_(logit)
        return torch.func.functional_call(layer, {"lora_A": A, "lora_B": B, "mix_logit": logit}, (x,))

    inputs = (torch.randn(2, 4, dtype=torch.float64, requires_grad=True),
              torch.randn(3, 2, dtype=torch.float64, requires_grad=True),
              torch.tensor(0.3, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(f, inputs)
    # only the cluster expert and the gate train; the base and the external expert stay frozen
    assert {n for n, p in layer.named_parameters() if p.requires_grad} == {"lora_A", "lora_B", "mix_logit"}


def test_plain_lora_equals_peft_on_a_llama_and_round_trips_peft_state_dicts():
    base = _tiny_llama()
    pm = peft.get_peft_model(_tiny_llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                             lora_dropout=0.0))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.normal_(std=0.3)
    ours = inject_mixed_lora(base, ("q_proj", "v_proj"), r=4, alpha=8)
    sd = peft.get_peft_model_state_dict(pm)
    assert set(sd) == set(lora_keys(ours))                     # peft's key names, 8 keys for 2 layers x q/v
    from_peft_state_dict(ours, sd)
    ids = torch.randint(0, 32, (3, 9))
    torch.testing.assert_close(ours(input_ids=ids).logits, pm(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    # and back: our state loads into a fresh peft model with nothing missing or unexpected
    fresh = peft.get_peft_model(_tiny_llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    res = peft.set_peft_model_state_dict(fresh, to_peft_state_dict(ours))
    assert not res.unexpected_keys
    torch.testing.assert_close(fresh(input_ids=ids).logits, pm(input_ids=ids).logits)


def test_from_peft_model_and_export_reproduce_the_personalised_model():
    pm = peft.get_peft_model(_tiny_llama(1), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.3)
    ids = torch.randint(0, 32, (2, 7))
    expected = pm(input_ids=ids).logits.detach()
    ours = from_peft_model(pm)
    assert all(m.r == 2 and m.scaling == 2.0 for m in lora_modules(ours).values())
    torch.testing.assert_close(ours(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
    _randomize(ours, seed=3, ext=True)                          # a client with both experts and its gates
    personalised = ours(input_ids=ids).logits.detach()
    config, sd = export_peft(ours)
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    twin = peft.get_peft_model(_tiny_llama(1), peft.LoraConfig(**config))
    peft.set_peft_model_state_dict(twin, sd)
    torch.testing.assert_close(twin(input_ids=ids).logits, personalised, atol=1e-5, rtol=1e-5)


def test_a_saved_model_reloaded_with_from_pretrained_trains(tmp_path):
    from icml26.common.tiny_lm import char_tokenizer, save_lab_model
    from icml26.fedtreelora.client import LoRATrainer

    tok = char_tokenizer()
    from icml26.common.tiny_lm import tiny_causal_lm

    save_lab_model(tiny_causal_lm(len(tok), hidden=16, layers=2, heads=2, kv_heads=1, intermediate=32), tok, tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    trainer = LoRATrainer(model, tok, r=2, alpha=4, batch_size=4)
    x = np.asarray([tok("abca:a=", add_special_tokens=False)["input_ids"]] * 8)
    y = np.array([0, 1] * 4)
    trained, _ = trainer.train((x, y), trainer.init_state(), None, None, steps=3, lr=0.05, seed=(0, 0, 1))
    assert set(trained) == set(trainer.init_state())
    assert any(np.abs(v).sum() > 0 for k, v in trained.items() if "lora_B" in k)   # B left zero: it trained
    assert trainer.correct((x, y), trained).shape == (8,)
    # the adapters save and reload through peft's own files
    config, sd = export_peft(trainer.model)
    pm = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True),
                             peft.LoraConfig(**config))
    peft.set_peft_model_state_dict(pm, sd)
    pm.save_pretrained(tmp_path / "adapter")
    back = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True),
                                          tmp_path / "adapter")
    ids = torch.tensor(x[:2])
    torch.testing.assert_close(back(input_ids=ids).logits, trainer.model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_gpt2_conv1d_projections_are_adapted_like_peft():
    cfg = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0,
                                  eos_token_id=0)
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(cfg).eval()
    torch.manual_seed(0)
    pm = peft.get_peft_model(transformers.GPT2LMHeadModel(cfg).eval(), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["c_attn"], fan_in_fan_out=True))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.normal_(std=0.3)
    ours = inject_mixed_lora(base, ("c_attn",), r=2, alpha=4)
    from_peft_state_dict(ours, peft.get_peft_model_state_dict(pm))
    ids = torch.randint(0, 32, (2, 6))
    torch.testing.assert_close(ours(input_ids=ids).logits, pm(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="r must be"):
        MixedLoRALinear(torch.nn.Linear(3, 3), r=0)
    with pytest.raises(ValueError, match="alpha"):
        MixedLoRALinear(torch.nn.Linear(3, 3), alpha=float("nan"))
    with pytest.raises(TypeError, match=r"nn\.Linear"):
        MixedLoRALinear(torch.nn.Conv2d(1, 1, 1))
    model = inject_mixed_lora(_tiny_llama(), r=4)
    with pytest.raises(ValueError, match="already"):
        inject_mixed_lora(model)
    with pytest.raises(ValueError, match="target_modules"):
        inject_mixed_lora(_tiny_llama(), ("nope",))
    state = get_lora_state(model)
    k = next(iter(state))
    with pytest.raises(ValueError, match="mismatched LoRA ranks"):
        set_lora_state(model, {**state, k: np.zeros((2, state[k].shape[1]))})
    with pytest.raises(ValueError, match="target modules"):
        set_lora_state(model, {kk: v for kk, v in state.items() if kk != k})
    with pytest.raises(ValueError, match="NaN"):
        set_lora_state(model, {**state, k: np.full(state[k].shape, np.nan)})
    with pytest.raises(ValueError, match="both A and B"):
        next(iter(lora_modules(model).values())).set_external(np.zeros((4, 16)), None)
