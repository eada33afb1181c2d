"""PSGRPOTrainer itself: the gradient of its loss, averaged over cutoff draws, converges to the full-trajectory
Dr.GRPO gradient (float64 oracle computed independently of the trainer); the prompt-conditioned law reaches it;
a multi-step TRL run improves its reward."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

import datasets

from icml26.common.tiny_lm import char_tokenizer, save_lab_model, tiny_causal_lm
from icml26.ps_ppo import PromptConditionedCutoff, UniformCutoff
from icml26.ps_ppo.microbatch import FullCutoff
from icml26.ps_ppo.trainer import PSGRPOConfig, PSGRPOTrainer

PROMPTS = ["1+2=", "3+4+5=", "1+2=", "3+4+5="]
COMPLETIONS = ["1+2=3", "3+4=7;7+5=12", "12", "3+4=7;7+5=1"]
ADV = torch.tensor([1.0, -0.5, -1.0, 0.5], dtype=torch.float64)
L_MAX = 14


def _trainer(tmp_path, tok, law=None, **kw):
    path = save_lab_model(
        tiny_causal_lm(len(tok), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, seed=0),
        tok,
        tmp_path / "model",
    )
    args = PSGRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=L_MAX,
        report_to="none",
        use_cpu=True,
        beta=0.0,
        **{"cutoff": "uniform", "ps_micro_batches": 2} | kw,
    )
    data = datasets.Dataset.from_dict({"prompt": ["1+2="] * 4})
    trainer = PSGRPOTrainer(
        str(path),
        reward_funcs=lambda completions, **k: [0.0] * len(completions),
        args=args,
        train_dataset=data,
        processing_class=tok,
        cutoff=law,
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _inputs(tok):
    """TRL's layout: left-padded prompts, right-padded completions, one advantage per row."""
    p = [tok(x, add_special_tokens=False)["input_ids"] for x in PROMPTS]
    c = [tok(x, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for x in COMPLETIONS]
    P, T = max(map(len, p)), max(map(len, c))
    pid = torch.full((4, P), tok.pad_token_id)
    pm = torch.zeros(4, P, dtype=torch.long)
    cid = torch.full((4, T), tok.pad_token_id)
    cm = torch.zeros(4, T, dtype=torch.long)
    for i in range(4):
        pid[i, P - len(p[i]) :], pm[i, P - len(p[i]) :] = torch.tensor(p[i]), 1
        cid[i, : len(c[i])], cm[i, : len(c[i])] = torch.tensor(c[i]), 1
    return {
        "prompt_ids": pid,
        "prompt_mask": pm,
        "completion_ids": cid,
        "completion_mask": cm,
        "advantages": ADV,
    }


def _full_gradient(model, inputs):
    """The oracle: grad of -1/(B L_max) sum_i A_i sum_t log pi(y_it), by a plain float64 forward on full rows."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    pos = (att.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, :-1].double()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    P = inputs["prompt_ids"].shape[1]
    comp = logp[:, P - 1 :] * inputs["completion_mask"]
    loss = -(ADV[:, None] * comp).sum() / (4 * L_MAX)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))])


def _mean_trainer_gradient(trainer, inputs, n):
    model = trainer.model
    model.zero_grad(set_to_none=True)
    for _ in range(n):
        trainer._compute_loss(model, inputs)
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]) / n


@pytest.mark.parametrize("cutoff", ["uniform", pytest.param("full_mixed", marks=pytest.mark.slow)])
def test_trainer_gradient_over_cutoff_draws_converges_to_the_full_gradient(tmp_path, cutoff):
    tok = char_tokenizer()
    trainer = _trainer(tmp_path, tok, cutoff=cutoff, cutoff_mix=0.25)
    trainer.model.double().train()
    inputs = _inputs(tok)
    full = _full_gradient(trainer.model, inputs)
    errors = []
    for n in (20, 240):
        mean = _mean_trainer_gradient(trainer, inputs, n)
        errors.append(float(torch.linalg.vector_norm(mean - full) / torch.linalg.vector_norm(full)))
    print(cutoff, errors)
    assert errors[1] < 0.1  # Monte Carlo error of 240 stratified draws
    assert errors[1] < errors[0] / 2  # shrinking like n^(-1/2) (a factor 3.5 expected)
    kept = trainer._metrics["train"]["ps/kept_token_fraction"]
    assert 0.3 < np.mean(kept) < 0.9  # truncation happened


@pytest.mark.slow
def test_trainer_with_a_token_normaliser_would_be_visible(tmp_path):
    """Control: the same convergence check rejects a biased variant (unweighted truncation) through the trainer."""
    import icml26.ps_ppo.trainer as trainer_module

    tok = char_tokenizer()
    trainer = _trainer(tmp_path, tok)
    trainer.model.double().train()
    inputs = _inputs(tok)
    full = _full_gradient(trainer.model, inputs)
    original = trainer_module.prefix_sampled_policy_loss
    try:
        trainer_module.prefix_sampled_policy_loss = lambda *a, **k: original(
            *a, **k, importance_weighting=False
        )
        mean = _mean_trainer_gradient(trainer, inputs, 240)
    finally:
        trainer_module.prefix_sampled_policy_loss = original
    assert float(torch.linalg.vector_norm(mean - full) / torch.linalg.vector_norm(full)) > 0.2


def test_prompt_conditioned_law_through_the_trainer(tmp_path):
    tok = char_tokenizer()
    seen = []

    def law_for(prompt):
        seen.append(prompt)
        return FullCutoff() if prompt == "1+2=" else UniformCutoff()

    law = PromptConditionedCutoff(law_for)
    trainer = _trainer(tmp_path, tok, law=law)
    assert trainer.cutoff is law
    trainer.model.train()
    inputs = _inputs(tok)
    drawn = []
    sample = law.sample
    law.sample = lambda lengths, generator=None, keys=None: (
        drawn.append(sample(lengths, generator, keys)) or drawn[-1]
    )
    trainer._compute_loss(trainer.model, inputs)
    assert set(seen) == {"1+2=", "3+4+5="}
    lengths = inputs["completion_mask"].sum(1)
    assert (
        drawn[0][0] == lengths[0] and drawn[0][2] == lengths[2]
    )  # the full-trajectory prompt keeps everything
    with pytest.raises(TypeError, match="cutoff"):
        _trainer(tmp_path, tok, law="uniform")


def test_micro_batch_count_does_not_change_the_gradient(tmp_path):
    tok = char_tokenizer()
    grads = []
    for m in (1, 3):
        trainer = _trainer(tmp_path / str(m), tok, ps_micro_batches=m, cutoff_seed=7)
        trainer.model.double().train()
        grads.append(_mean_trainer_gradient(trainer, _inputs(tok), 3))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)  # float32 inside TRL's log-softmax


def test_bad_micro_batches(tmp_path):
    with pytest.raises(ValueError, match="ps_micro_batches"):
        _trainer(tmp_path, char_tokenizer(), ps_micro_batches=0)


def test_multi_step_trl_run_raises_the_reward(tmp_path):
    tok = char_tokenizer()
    path = save_lab_model(tiny_causal_lm(len(tok), hidden=32, layers=1, seed=0), tok, tmp_path / "model")
    ones = tok("1", add_special_tokens=False)["input_ids"][0]
    rewards = []

    def reward(completions, completion_ids=None, **kw):
        r = [float(np.mean([t == ones for t in ids])) if ids else 0.0 for ids in completion_ids]
        rewards.append(float(np.mean(r)))
        return r

    args = PSGRPOConfig(
        output_dir=str(tmp_path / "out"),
        cutoff="full_mixed",
        cutoff_mix=0.25,
        max_steps=24,
        num_generations=8,
        per_device_train_batch_size=8,
        max_completion_length=8,
        learning_rate=3e-2,
        report_to="none",
        use_cpu=True,
        beta=0.0,
        ps_micro_batches=2,
        logging_steps=1,
        seed=0,
    )
    data = datasets.Dataset.from_dict({"prompt": ["1+2="] * 64})
    trainer = PSGRPOTrainer(
        str(path), reward_funcs=reward, args=args, train_dataset=data, processing_class=tok
    )
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.train()
    assert np.mean(rewards[-6:]) > np.mean(rewards[:6]) + 0.2


def test_trainer_uses_the_sampling_policys_log_probs_and_clips(tmp_path):
    """With TRL's ``old_per_token_logps`` (num_iterations > 1) the ratio is to the sampling policy and the clip
    acts: full cutoffs (S = 1) give exactly the float64 clipped Dr.GRPO gradient, not the on-policy one."""
    tok = char_tokenizer()
    trainer = _trainer(tmp_path, tok, law=FullCutoff())
    model = trainer.model.double().train()
    inputs = _inputs(tok)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    T = inputs["completion_ids"].shape[1]
    # TRL's own per-token log-probs of the full rows (its fused head differs from a plain log-softmax by ~5e-4)
    logp = trainer._get_per_token_logps_and_entropies(model, ids, att, T)[0].double()
    # the sampling policy differs by +-0.3 nats per token: ratios e^-0.3 = 0.74 and e^0.3 = 1.35, outside [0.8, 1.2]
    delta = 0.3 * torch.tensor([(-1.0) ** (i + t) for i in range(4) for t in range(T)]).reshape(4, T)
    old = (logp.detach() + delta).double()
    ratio = torch.exp(logp - old)
    surrogate = torch.min(ratio * ADV[:, None], ratio.clamp(0.8, 1.2) * ADV[:, None])
    oracle_loss = -(surrogate * inputs["completion_mask"]).sum() / (4 * L_MAX)
    oracle = torch.cat([g.reshape(-1) for g in torch.autograd.grad(oracle_loss, list(model.parameters()))])
    on_policy = _full_gradient(model, inputs)
    model.zero_grad(set_to_none=True)
    trainer._compute_loss(model, inputs | {"old_per_token_logps": old})
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(got, oracle, rtol=1e-4, atol=1e-8)
    # the clip zeroes the gradient of about half the tokens: far from the on-policy gradient
    assert float(torch.linalg.vector_norm(oracle - on_policy) / torch.linalg.vector_norm(on_policy)) > 0.2
