"""The tiny-language-model lab: tokenizer, models, the from_pretrained path, tasks, batches, SFT, generation, cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from icml26.common import tiny_lm
from icml26.common.tiny_lm import (
    AdditionChain,
    Reverse,
    Sorting,
    cached,
    char_tokenizer,
    completion_batch,
    completion_logps,
    generate,
    load_lab_model,
    save_lab_model,
    sft,
    tiny_causal_lm,
)


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def test_tokenizer_round_trip(tok):
    text = "12+7=19;sort:3,1=1,3 rev:ab=ba"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.pad_token_id == 0 and tok.eos_token_id == 2
    assert tok("#", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    with pytest.raises(ValueError, match="repeated"):
        char_tokenizer("aa")


def test_save_and_from_pretrained_round_trip(tok, tmp_path):
    model = tiny_causal_lm(len(tok), seed=3)
    save_lab_model(model, tok, tmp_path / "m")
    loaded, tok2 = load_lab_model(tmp_path / "m")
    x = torch.tensor([tok("3+4=", add_special_tokens=False)["input_ids"]])
    torch.testing.assert_close(loaded(x).logits, model(x).logits)
    assert tok2.decode(tok2("ab", add_special_tokens=False)["input_ids"]) == "ab"
    with pytest.raises(FileNotFoundError):
        load_lab_model(tmp_path / "nothing")


@pytest.mark.parametrize("family", ["llama", "mixtral", "qwen2_moe", "olmoe"])
def test_model_families_forward_and_seed(tok, family):
    a, b = tiny_causal_lm(len(tok), family=family, seed=1), tiny_causal_lm(len(tok), family=family, seed=1)
    x = torch.tensor([[5, 6, 7]])
    torch.testing.assert_close(a(x).logits, b(x).logits)
    assert a(x).logits.shape == (1, 3, len(tok))
    with pytest.raises(ValueError, match="family"):
        tiny_causal_lm(len(tok), family="gpt")


def test_tasks_and_rewards():
    add = AdditionChain(terms=3, max_value=9)
    ex = add.solve("3+5+2=")
    assert (ex.completion, ex.answer) == ("3+5=8;8+2=10", "10")
    assert add.reward("3+5+2=", "3+5=8;8+2=10") == 1.0 and add.reward("3+5+2=", "3+5=9;9+2=11") == 0.0
    assert add.step_errors("3+5+2=", "3+5=9;9+2=11") == 2 and add.step_errors("3+5+2=", ex.completion) == 0
    rng = np.random.default_rng(0)
    noisy = [add.noisy_completion(add.sample(rng), rng, 1.0) for _ in range(20)]
    assert all(add.step_errors(*_split(n)) >= 1 for n in noisy)
    assert Sorting().solve("sort:3,1,2=").completion == "1,2,3"
    assert Reverse().solve("rev:abc=").answer == "cba"
    with pytest.raises(ValueError):
        AdditionChain(terms=1)


def _split(text: str) -> tuple[str, str]:
    """(prompt, completion) from a noisy completion by recomputing the prompt from its steps."""
    steps = text.split(";")
    first = steps[0].split("=")[0].split("+")
    terms = [first[0], first[1]] + [s.split("=")[0].split("+")[1] for s in steps[1:]]
    return "+".join(terms) + "=", text


def test_completion_batch_layout_and_logps(tok):
    batch = completion_batch(tok, ["1+1=", "12+3="], ["2", "15"])
    assert batch["input_ids"].shape == (2, 8)
    assert batch["completion_mask"][0].tolist() == [0, 0, 0, 0, 1, 1, 0, 0]  # "2" + eos, then padding
    assert batch["input_ids"][0, 5].item() == tok.eos_token_id
    model = tiny_causal_lm(len(tok), seed=0)
    logps, mask = completion_logps(model, batch)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    manual = torch.log_softmax(logits[0, 3], -1)[batch["input_ids"][0, 4]]
    assert logps[0, 3].item() == pytest.approx(manual.item(), rel=1e-5) and mask[0, 3] == 1
    with pytest.raises(ValueError, match="empty completion"):
        completion_batch(tok, ["1="], [""], add_eos=False)
    with pytest.raises(ValueError, match="prompts but"):
        completion_batch(tok, ["1="], ["1", "2"])


def test_sft_learns_and_is_deterministic(tok):
    task = Reverse(length=3)
    rng = np.random.default_rng(0)
    examples = [task.sample(rng) for _ in range(200)]
    prompts, comps = [e.prompt for e in examples], [e.completion for e in examples]

    def trained():
        return sft(tiny_causal_lm(len(tok), seed=0), tok, prompts, comps, steps=30, batch_size=16, seed=1, desc=None)

    a, b = trained(), trained()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    batch = completion_batch(tok, prompts[:32], comps[:32])
    before = tiny_causal_lm(len(tok), seed=0)
    nll = lambda m: -(completion_logps(m, batch)[0] * completion_logps(m, batch)[1]).sum().item()  # noqa: E731
    assert nll(a) < nll(before)


def test_generation_is_seeded(tok):
    model = tiny_causal_lm(len(tok), seed=0)
    prompts = ["1+2=", "33+4=", "rev:ab="]
    assert generate(model, tok, prompts, max_new_tokens=5) == generate(model, tok, prompts, max_new_tokens=5)
    s1 = generate(model, tok, prompts, max_new_tokens=5, temperature=1.0, seed=4)
    assert s1 == generate(model, tok, prompts, max_new_tokens=5, temperature=1.0, seed=4)
    assert tok.padding_side == "right"
    with pytest.raises(ValueError, match="temperature"):
        generate(model, tok, prompts, temperature=-1.0)


def test_cache_builds_once(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("ICML26_CACHE", str(tmp_path))
    calls = []

    def build():
        calls.append(1)
        return tiny_causal_lm(len(tok), seed=2), tok

    m1, _ = cached({"k": 1}, build)
    m2, _ = cached({"k": 1}, build)
    cached({"k": 2}, build)
    assert len(calls) == 2
    for p, q in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(p, q)
    assert tiny_lm.cache_dir() == tmp_path


def test_sft_start_matches_the_hand_built_warm_start_and_caches(tmp_path, monkeypatch):
    from icml26.common.tiny_lm import sft_start

    monkeypatch.setenv("ICML26_CACHE", str(tmp_path))
    task = AdditionChain(terms=2, max_value=9)
    calls = []

    def data():
        calls.append(1)
        rng = np.random.default_rng(3)
        examples = [task.sample(rng) for _ in range(40)]
        return [e.prompt for e in examples], [task.noisy_completion(e, rng, 0.1) for e in examples]

    model, tok2 = sft_start({"k": "sft_start"}, data, steps=3, hidden=16, seed=5, desc=None)
    again, _ = sft_start({"k": "sft_start"}, data, steps=3, hidden=16, seed=5, desc=None)
    assert len(calls) == 1 and not model.training and not again.training
    # the dozen lines the two papers wrote by hand
    ref_tok = char_tokenizer()
    prompts, comps = data()
    ref = tiny_causal_lm(len(ref_tok), hidden=16, layers=2, intermediate=32, seed=5)
    sft(ref, ref_tok, prompts, comps, steps=3, seed=5, desc=None)
    assert tok2.get_vocab() == ref_tok.get_vocab()
    for m in (model, again):
        for p, q in zip(m.parameters(), ref.parameters(), strict=True):
            assert torch.equal(p, q)
