"""COCA: concept concentration for faithful representation intervention against jailbreaks.

Paper: Hongzheng Yang, Yongqiang Chen, Zeyu Qin, Tongliang Liu, Chaowei Xiao, Kun Zhang, Bo Han, "Does
Representation Intervention Really Identify Desired Concepts and Elicit Alignment?", ICML 2026,
https://arxiv.org/abs/2505.18672 (official code: tmlr-group/COCA, a LLaMA-Factory fork, not reviewed).

Representation interventions (LoFiT, ReFT, ...) trained on refusal data cannot erase a harmful concept that the
model encodes non-linearly, so they fail on out-of-distribution jailbreaks. COCA refactors the alignment data so
each answer first names the request's potentially unsafe concepts and then decides, which concentrates the
concept where a simple (linear) intervention can act.

Here: :func:`coca_refactor` (a ``datasets.Dataset.map`` function), :class:`LoReFTIntervention` and
:class:`LoFiTIntervention` (+ :func:`select_heads`) as hook-based ``nn.Module`` objects on any HF causal LM
(trained with :func:`train_intervention` or the resumable :class:`InterventionTrainer`),
:class:`ErasureHook` with LEACE from ``concept-erasure``, a probe toolkit (:mod:`icml26.coca.probes`), a tiered
rule judge and :class:`SafetyEval`. Needs the ``coca`` extra.

**Not implemented**: the paper's LLM concept labeller (pass your own ``concept_fn``), its exact template and
hyper-parameters (not public), CAST / ACE interventions, LLM judges and the public jailbreak benchmarks (the
reproduction uses an embedded tiny-LM world; see ``README.md``).
"""

from .evaluation import SafetyEval, SafetyReport
from .intervention import (
    ErasureHook,
    InterventionTrainer,
    LoFiTIntervention,
    LoReFTIntervention,
    decision_states,
    load_intervention,
    select_heads,
    train_intervention,
)
from .judge import TieredJudge, Verdict
from .refactor import coca_refactor, render_analysis

__all__ = ["ErasureHook", "InterventionTrainer", "LoFiTIntervention", "LoReFTIntervention", "SafetyEval",
           "SafetyReport", "TieredJudge", "Verdict", "coca_refactor", "decision_states", "load_intervention",
           "render_analysis", "select_heads", "train_intervention"]
