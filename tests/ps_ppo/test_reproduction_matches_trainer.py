"""The reproduction's update (``experiment.update_pass``) is ``PSGRPOTrainer``'s update: on the same batch, the same
weights and the same cutoffs, the gradient the reproduction's pass leaves equals the one
``PSGRPOTrainer._compute_loss`` accumulates (TRL's left-padded layout against the lab's right-padded one), for the
uniform law and the reproduction's full + uniform mixture, weighted by each law's survival."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("trl")

from icml26.common.tiny_lm import char_tokenizer, completion_batch, tiny_causal_lm
from icml26.ps_ppo import MixtureCutoff, UniformCutoff
from icml26.ps_ppo.experiment import Config, make_law, observe_groups, update_pass
from icml26.ps_ppo.microbatch import FullCutoff

from .test_trainer_unbiased import ADV, COMPLETIONS, L_MAX, PROMPTS, _inputs, _trainer


class _Fixed:
    """A law whose draws are given (``cutoffs``) and whose survival is ``base``'s: both updates see the same."""

    def __init__(self, base, cutoffs):
        self.base, self.cutoffs = base, cutoffs

    def sample(self, lengths, generator=None, keys=None):
        return self.cutoffs.clone()

    def survival(self, lengths, max_len, keys=None):
        return self.base.survival(lengths, max_len)


def _grad(model):
    return torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in model.parameters()
    ])


@pytest.mark.parametrize(
    "base",
    [UniformCutoff(), MixtureCutoff([FullCutoff(), UniformCutoff()], [0.25, 0.75])],
    ids=["uniform", "mixture"],
)
def test_update_pass_equals_the_trainers_update(tmp_path, base):
    tok = char_tokenizer()
    batch = completion_batch(tok, PROMPTS, COMPLETIONS)
    lengths = batch["completion_mask"].sum(1).long()
    g = torch.Generator().manual_seed(5)
    cfg = dataclasses.replace(Config(), ppo_epochs=1, micro_batches=2, max_new_tokens=L_MAX)
    for k in range(3):
        cutoffs = base.sample(lengths, g)
        # bf16=False: TRL's default autocasts the forward to bfloat16 on this CPU, which alone moves the gradient
        # by about 0.25 %
        trainer = _trainer(tmp_path / f"{k}", tok, law=_Fixed(base, cutoffs), ps_micro_batches=2, bf16=False)
        trainer.model.double().train()
        # the same weights in a plain copy of the lab model (the trainer's copy carries TRL's checkpointing hooks)
        policy = tiny_causal_lm(len(tok), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, seed=1).double()
        policy.load_state_dict(trainer.model.state_dict())
        trainer.model.zero_grad(set_to_none=True)
        trainer._compute_loss(trainer.model, _inputs(tok))
        expected = _grad(trainer.model)
        survival = base.survival(lengths, int(lengths.max()))
        update_pass(policy, torch.optim.SGD(policy.parameters(), lr=0.0), batch, ADV.float(), cutoffs, survival,
                    cfg=cfg, weighted=True)
        got = _grad(policy)
        assert float((got - expected).norm() / expected.norm()) < 1e-5  # float32 log-softmax in both
        # a different draw gives a different gradient: the comparison sees the cutoffs
        other = lengths.clone()
        update_pass(policy, torch.optim.SGD(policy.parameters(), lr=0.0), batch, ADV.float(), other, survival,
                    cfg=cfg, weighted=True)
        if not torch.equal(other, cutoffs):
            assert float((_grad(policy) - expected).norm() / expected.norm()) > 1e-3


def test_the_trainer_feeds_the_prompt_conditioned_law_as_the_reproduction_does(tmp_path):
    """``PSGRPOTrainer(cutoff=StratifiedCutoff(AdaptiveCutoff()))`` reads each prompt's decision point off its rows
    (positive advantage = correct) before drawing, the same decision points the reproduction's ``observe_groups``
    reads off the same rollouts with 0/1 rewards."""
    tok = char_tokenizer()
    trainer = _trainer(tmp_path, tok, law=make_law("ps_ppo_adaptive"), bf16=False)
    trainer.model.train()
    trainer._compute_loss(trainer.model, _inputs(tok))
    # "1+2=": "1+2=3" (A = 1) against "12" (A = -1) differ at the 2nd token; "3+4+5=": "3+4=7;7+5=1<eos>"
    # (A = 0.5) against "3+4=7;7+5=12" (A = -0.5) at the 12th
    assert trainer.cutoff.base.decision == {"1+2=": (2.0, 1), "3+4+5=": (12.0, 1)}
    law = make_law("ps_ppo_adaptive")
    batch = completion_batch(tok, PROMPTS, COMPLETIONS)
    observe_groups(law, PROMPTS, batch, (ADV > 0).float())
    assert law.base.decision == trainer.cutoff.base.decision
    trainer.model.eval()  # evaluation does not feed it
    trainer._compute_loss(trainer.model, _inputs(tok))
    assert trainer.cutoff.base.decision["1+2="] == (2.0, 1)
