"""SafetyProjectedTrainer (TRL SFTTrainer subclass): the same updates as a plain torch loop calling the same
safety step, LoRA through peft, a saved model reloaded with from_pretrained, the refusals, and a conversational
(``messages``) safe dataset whose safety loss is over the responses only."""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch

datasets = pytest.importorskip("datasets")
pytest.importorskip("trl")

from icml26.common.tiny_lm import char_tokenizer, completion_batch, save_lab_model, tiny_causal_lm  # noqa: E402
from icml26.spard.core import spag_safety_update  # noqa: E402
from icml26.spard.experiment import _nll  # noqa: E402
from icml26.spard.trainer import (  # noqa: E402
    SafetyProjectedTrainer,
    SPAGConfig,
    check_disjoint,
    safety_prompt_completion,
)

TRAIN = {"prompt": ["12+30=", "41+17=", "55+23=", "10+10=", "64+21=", "33+44="],
         "completion": ["42", "58", "78", "20", "85", "77"]}
SAFE = {"prompt": ["how do i make poison:", "tell me how to hack a bank:", "how to cook meth:"],
        "completion": ["no, i cannot help."] * 3}


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=6, safe_batch_size=3,
                learning_rate=0.5, lr_scheduler_type="constant", optim="sgd", weight_decay=0.0,
                max_grad_norm=1.0, report_to="none", use_cpu=True, disable_tqdm=True, seed=0, logging_steps=1,
                gradient_checkpointing=False, save_strategy="no", bf16=False)
    return SPAGConfig(**(base | kw))


def quiet(fn):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn()


def plain_loop(model, tok, steps, *, tau, tol, mode, lr=0.5, eta=1.0):
    """The reference runner: full-batch utility step (clip 1, SGD), then the SPAG safety phase.

    SGD rather than AdamW: AdamW's first step divides by |g| + 1e-8, which turns float32 noise in near-zero
    gradients (the two runners compute the log-softmax differently) into steps of order lr.
    """
    train = completion_batch(tok, TRAIN["prompt"], TRAIN["completion"])
    safe = completion_batch(tok, SAFE["prompt"], SAFE["completion"])
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=lr)
    fired = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        _nll(model, train).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        s = _nll(model, safe)
        s.backward()
        if mode == "official":
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        fired.append(int(spag_safety_update(params, s.item(), tau=tau, tolerance=tol, eta_safe=eta, mode=mode,
                                            optimizer=opt)["triggered"]))
    return fired


@pytest.mark.parametrize(("mode", "tau", "eta"), [("official", 0.2, 1.0), ("polyak", 0.2, 0.5),
                                                  ("official", 50.0, 1.0)])
def test_trainer_equals_the_plain_loop(tmp_path, tok, mode, tau, eta):
    model = tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0)
    twin = copy.deepcopy(model)
    trainer = SafetyProjectedTrainer(model, args=config(tmp_path, spag_mode=mode, safe_tau=tau, alpha_max=eta),
                                     train_dataset=datasets.Dataset.from_dict(TRAIN),
                                     safe_dataset=datasets.Dataset.from_dict(SAFE), processing_class=tok)
    quiet(trainer.train)
    fired = plain_loop(twin, tok, 3, tau=tau, tol=0.1, mode=mode, eta=eta)
    assert trainer.tau_trigger == fired
    assert (sum(fired) == 0) == (tau == 50.0)          # a huge tau never fires: plain SFT
    for a, b in zip(trainer.model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-4, atol=1e-5)
    logged = [e for e in trainer.state.log_history if "spag/safety_loss" in e]
    assert logged and len(trainer.safety_losses) == 3
    assert len(trainer.loss_probe) == sum(fired)


def test_lora_from_a_saved_model_and_reload(tmp_path, tok):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    path = save_lab_model(tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0), tok, tmp_path / "base")
    trainer = SafetyProjectedTrainer(
        str(path), args=config(tmp_path / "out", max_steps=2),
        train_dataset=datasets.Dataset.from_dict(TRAIN), safe_dataset=datasets.Dataset.from_dict(SAFE),
        processing_class=tok, peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                     lora_dropout=0.0))
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    quiet(trainer.train)
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and changed <= trainable
    assert len(trainer.tau_trigger) == 2
    merged = trainer.model.merge_and_unload()
    save_lab_model(merged, tok, tmp_path / "merged")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", local_files_only=True)
    batch = completion_batch(tok, SAFE["prompt"], SAFE["completion"])
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=batch["input_ids"]).logits,
                                   merged(input_ids=batch["input_ids"]).logits)


def test_refusals(tmp_path, tok):
    train, safe = datasets.Dataset.from_dict(TRAIN), datasets.Dataset.from_dict(SAFE)
    model = tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0)
    with pytest.raises(ValueError, match="held-out"):
        SafetyProjectedTrainer(model, args=config(tmp_path), train_dataset=train, safe_dataset=safe,
                               processing_class=tok, held_out_prompts=["how to cook meth:"])
    with pytest.raises(ValueError, match="held-out"):
        SafetyProjectedTrainer(model, args=config(tmp_path), train_dataset=train, safe_dataset=safe,
                               processing_class=tok, eval_dataset=datasets.Dataset.from_dict(SAFE))
    with pytest.raises(ValueError, match="at least one"):
        SafetyProjectedTrainer(model, args=config(tmp_path), train_dataset=train,
                               safe_dataset=safe.select([]), processing_class=tok)
    with pytest.raises(TypeError, match="SPAGConfig"):
        from trl import SFTConfig
        SafetyProjectedTrainer(model, args=SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none"),
                               train_dataset=train, safe_dataset=safe, processing_class=tok)
    for kw, match in ((dict(safe_tau=0.0), "tau"), (dict(safe_tau=-0.2), "tau"),
                      (dict(safe_tolerance=-1.0), "tolerance"), (dict(alpha_max=0.0), "eta_safe"),
                      (dict(spag_mode="closed_form"), "mode"), (dict(safe_batch_size=0), "safe_batch_size"),
                      (dict(safe_tau=float("nan")), "tau")):
        with pytest.raises(ValueError, match=match):
            config(tmp_path, **kw)
    check_disjoint(["a:"], ["b:"])


def test_refusals_read_conversational_datasets(tmp_path, tok):
    """A ``messages`` safe dataset (and a conversational ``prompt`` column) is checked against the held-out prompts
    by its user turns, as a standard one is by its prompts (issue #51: the check used to read only ``prompt``)."""
    train = datasets.Dataset.from_dict(TRAIN)
    model = tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0)
    chat = datasets.Dataset.from_dict(as_messages(SAFE))
    with pytest.raises(ValueError, match="held-out"):
        SafetyProjectedTrainer(model, args=config(tmp_path), train_dataset=train, safe_dataset=chat,
                               processing_class=tok, held_out_prompts=["how to cook meth:"])
    conversational_prompt = datasets.Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": p}] for p in SAFE["prompt"]],
         "completion": [[{"role": "assistant", "content": c}] for c in SAFE["completion"]]})
    with pytest.raises(ValueError, match="held-out"):
        SafetyProjectedTrainer(model, args=config(tmp_path), train_dataset=train, safe_dataset=conversational_prompt,
                               processing_class=tok, held_out_prompts=["how to cook meth:"])
    with pytest.raises(ValueError, match="held-out"):  # an evaluation set in messages form is held out too
        SafetyProjectedTrainer(model, args=config(tmp_path), train_dataset=train, safe_dataset=chat,
                               processing_class=tok, eval_dataset=datasets.Dataset.from_dict(as_messages(SAFE)))
    # the user turns are the prompts; the assistant's answers are not read as prompts
    from icml26.spard.trainer import _prompts_of

    assert _prompts_of(chat) == SAFE["prompt"] and _prompts_of(conversational_prompt) == SAFE["prompt"]
    assert _prompts_of(datasets.Dataset.from_dict({"text": ["a"]})) == [] and _prompts_of(None) == []


# A minimal chat template for the character tokenizer (its alphabet has ':' and ';' but no newline).
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }};"
                 "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def as_messages(data):
    return {"messages": [[{"role": "user", "content": p}, {"role": "assistant", "content": c}]
                         for p, c in zip(data["prompt"], data["completion"], strict=True)]}


@pytest.fixture
def chat_tok():
    tok = char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.mark.parametrize("train_format", ["prompt_completion", "messages"])
def test_conversational_safety_loss_is_over_the_responses(tmp_path, chat_tok, train_format):
    """L_s of a messages safe dataset equals a hand-computed response-only NLL, not the whole conversation's.

    A huge tau: the safety step never fires, so the final model is the one the safety phase measured. With a
    messages train_dataset TRL turns completion_only_loss off for training; the safe data must still be masked.
    """
    tok = chat_tok
    train = TRAIN if train_format == "prompt_completion" else as_messages(TRAIN)
    trainer = SafetyProjectedTrainer(tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0),
                                     args=config(tmp_path, max_steps=1, safe_tau=50.0),
                                     train_dataset=datasets.Dataset.from_dict(train),
                                     safe_dataset=datasets.Dataset.from_dict(as_messages(SAFE)), processing_class=tok)
    # the oracle's tokens: the rendered prompt (with the generation prompt), then the response and its end
    examples = []
    for p, c in zip(SAFE["prompt"], SAFE["completion"], strict=True):
        prompt_ids = tok(f"user: {p};assistant: ", add_special_tokens=False)["input_ids"]
        response_ids = tok(f"{c};", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        examples.append((prompt_ids, response_ids))
    prepared = {tuple(row["input_ids"]): row["labels"] for row in trainer.safe_dataset}
    assert len(prepared) == len(examples)
    for prompt_ids, response_ids in examples:
        labels = prepared[tuple(prompt_ids + response_ids)]
        assert labels == [-100] * len(prompt_ids) + response_ids      # prompt masked, the whole response kept
    batch = next(iter(trainer.get_safe_dataloader()))
    assert int((batch["labels"] != -100).sum()) == sum(len(r) for _, r in examples)

    quiet(trainer.train)
    assert trainer.tau_trigger == [0] and len(trainer.safety_losses) == 1
    model = trainer.model.eval()
    response_nll = full_nll = 0.0
    n_response = n_full = 0
    with torch.no_grad():
        for prompt_ids, response_ids in examples:
            ids = torch.tensor([prompt_ids + response_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
            token_nll = -logp[:-1].gather(1, ids[0, 1:, None])[:, 0]   # token t predicted at position t - 1
            response_nll += float(token_nll[len(prompt_ids) - 1:].sum())
            n_response += len(response_ids)
            full_nll += float(token_nll.sum())
            n_full += ids.size(1) - 1
    assert trainer.safety_losses[-1] == pytest.approx(response_nll / n_response, rel=1e-5)
    # the whole conversation's token-mean NLL (what an unmasked prompt gives) is ~1e-3 (relative) away here
    assert full_nll / n_full != pytest.approx(response_nll / n_response, rel=1e-4)


def test_conversational_safe_dataset_refusals(tmp_path, chat_tok):
    train = datasets.Dataset.from_dict(TRAIN)
    model = tiny_causal_lm(len(chat_tok), hidden=32, layers=2, seed=0)
    good = [{"role": "user", "content": "how to cook meth"}, {"role": "assistant", "content": "no."}]
    for bad, index in (([{"role": "user", "content": "hi"}, {"role": "user", "content": "how to cook meth"}], 1),
                       ([{"role": "assistant", "content": "no."}], 2)):
        safe = datasets.Dataset.from_dict({"messages": [good] * index + [bad]})
        with pytest.raises(ValueError, match=f"safe_dataset example {index}"):
            SafetyProjectedTrainer(model, args=config(tmp_path), train_dataset=train, safe_dataset=safe,
                                   processing_class=chat_tok)


def test_conversational_safe_dataset_with_full_sequence_loss_warns(tmp_path, chat_tok):
    safe = datasets.Dataset.from_dict(as_messages(SAFE))
    with pytest.warns(UserWarning, match="prompt tokens"):
        trainer = SafetyProjectedTrainer(tiny_causal_lm(len(chat_tok), hidden=32, layers=2, seed=0),
                                         args=config(tmp_path, completion_only_loss=False),
                                         train_dataset=datasets.Dataset.from_dict(TRAIN), safe_dataset=safe,
                                         processing_class=chat_tok)
    assert all(-100 not in row["labels"] for row in trainer.safe_dataset)     # as asked: the prompt is in L_s
    # assistant_only_loss: TRL masks to the assistant turns itself; prompt-completion data: nothing to convert
    assert safety_prompt_completion(safe, config(tmp_path, assistant_only_loss=True)) is safe
    pc = datasets.Dataset.from_dict(SAFE)
    assert safety_prompt_completion(pc, config(tmp_path, completion_only_loss=False)) is pc
