"""Tiny MoE models of three families shared by the unsafe-routes tests."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm

FAMILIES = ("mixtral", "qwen2_moe", "olmoe")


@pytest.fixture(scope="session")
def tok():
    return char_tokenizer()


@pytest.fixture(scope="session", params=FAMILIES)
def moe(request, tok):
    return tiny_causal_lm(
        len(tok), family=request.param, layers=2, hidden=32, experts=4, top_k=2, seed=0
    ).eval()


@pytest.fixture(scope="session")
def mixtral(tok):
    return tiny_causal_lm(len(tok), family="mixtral", layers=2, hidden=32, experts=4, top_k=2, seed=1).eval()
