"""Tiny causal LMs shared by the COCA tests."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm


@pytest.fixture(scope="session")
def tok():
    return char_tokenizer()


@pytest.fixture(scope="session")
def llama(tok):
    model = tiny_causal_lm(len(tok), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=0).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.fixture(scope="session")
def gpt2(tok):
    import transformers as tf

    cfg = tf.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1,
                        eos_token_id=2, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    import torch

    torch.manual_seed(0)
    return tf.GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="session")
def qwen2(tok):
    import torch
    import transformers as tf

    cfg = tf.Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return tf.Qwen2ForCausalLM(cfg).eval()
