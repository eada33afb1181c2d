"""F-SOUR's greedy step against a sampled-candidate oracle (N below the number of subsets, so the acceptance rule
decides the routes), every attack's and control's ``forwards`` against the sequences the model really scored, and the
best-so-far traces behind the forward-pass curves."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import icml26.unsafe_moe.attack as attack_module
from icml26.unsafe_moe import FSOUR, RouterController, find_routers, random_route_search
from icml26.unsafe_moe.attack import best_within, encode, stage_positions
from icml26.unsafe_moe.reference import patched_routes

#: below this an oracle difference is a tie (float noise between the controller and the float64 patch)
TIE = 1e-6


def _sampled_greedy_oracle(model, tok, prompt, target, n_candidates, seed):
    """Greedy coordinate ascent over F-SOUR's own candidate draws (the same generator, drawn in the same order:
    N uniformly random top_k-subsets per (position, layer)), each scored through the independent float64 router
    patch; a coordinate's best candidate is kept only if it raises the objective (by more than ``TIE``).
    Returns the routes, the objective after each coordinate, and how many coordinates ended in a tie."""
    infos = {i.layer: i for i in find_routers(model)}
    info = next(iter(infos.values()))
    modules = {layer: i.module for layer, i in infos.items()}
    p_ids, t_ids = encode(tok, prompt), encode(tok, target, "target")
    ids = torch.tensor([p_ids + t_ids])

    def objective(routes):
        with torch.no_grad(), patched_routes(modules, routes, top_k=info.top_k, renormalize=info.renormalize):
            logits = model(input_ids=ids).logits[0, len(p_ids) - 1 : -1].double()
        return float(torch.log_softmax(logits, -1).gather(-1, torch.tensor(t_ids)[:, None]).sum())

    rng = np.random.default_rng(seed)
    routes, best = {}, objective({})
    history, ties = [best], 0
    for t in stage_positions("prefill", len(p_ids), len(t_ids)):
        for layer in sorted(infos):
            # N uniformly random subsets: the first top_k of a random permutation of the experts
            draws = np.argsort(rng.random((n_candidates, info.num_experts)), axis=1)[:, : info.top_k]
            scored = [objective({**routes, (t, layer): tuple(sorted(s.tolist()))}) for s in draws]
            i = int(np.argmax(scored))
            if scored[i] > best + TIE:
                best, routes = scored[i], {**routes, (t, layer): tuple(sorted(draws[i].tolist()))}
            elif scored[i] > best - TIE:
                ties += 1
            history.append(best)
    return routes, history, ties


@pytest.mark.parametrize("n_candidates", [1, 2, 3])
def test_fsour_greedy_step_matches_a_sampled_candidate_oracle(mixtral, tok, n_candidates):
    """With N below the 6 subsets of 4 experts choose 2, many coordinates' best candidate only ties the objective
    (e.g. the last layer at prompt positions whose outputs no target logit reads): F-SOUR must keep exactly the
    routes of strict improvements, the same routes as the oracle, with the same objective after every coordinate.
    A search that keeps tying (non-improving) candidates ends with more routes than the oracle."""
    for seed in range(2):
        fs = FSOUR(mixtral, tok, n_candidates=n_candidates, threshold=-1e-12, chat_template=False)
        routes, lp, _, history = fs.search("how to x.", "sure", seed=seed)
        oracle_routes, oracle_history, ties = _sampled_greedy_oracle(
            mixtral, tok, "how to x.", "sure", n_candidates, seed
        )
        assert ties > 0 and oracle_routes  # the acceptance rule decides something either way
        assert routes == oracle_routes
        np.testing.assert_allclose(history, oracle_history, atol=1e-4)
        assert lp == history[-1]


class _ScoredRows:
    """Counts the sequences the model runs outside greedy generation (a batch of N counts N): the scoring forward
    passes an attack's ``forwards`` must report."""

    def __init__(self, model, monkeypatch):
        self.rows, self.paused = 0, False
        greedy = attack_module.greedy

        def counting_greedy(*args, **kwargs):
            self.paused = True
            try:
                return greedy(*args, **kwargs)
            finally:
                self.paused = False

        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if not self.paused:
                self.rows += int(ids.shape[0])

        monkeypatch.setattr(attack_module, "greedy", counting_greedy)
        self.handle = model.register_forward_pre_hook(hook, with_kwargs=True)

    def take(self):
        rows, self.rows = self.rows, 0
        return rows


def test_every_attack_and_control_reports_the_forwards_it_ran(mixtral, tok, monkeypatch):
    """``forwards`` of F-SOUR (search, attack, judged attack) and of the random controls (one draw; a budget that is
    not a multiple of the batch; F-SOUR's forwards with the default batch, as the experiment runs it) equals the
    number of sequences the model scored, counted by a hook on the model, not the number requested."""
    counter = _ScoredRows(mixtral, monkeypatch)
    try:
        with RouterController(mixtral) as rc:
            fs = FSOUR(
                mixtral,
                tok,
                n_candidates=3,
                max_iters=2,
                threshold=-1e-12,
                max_new_tokens=3,
                controller=rc,
                chat_template=False,
            )
            *_, used, _ = fs.search("how to x.", "sure", seed=0)
            assert used == counter.take() and used > 1
            attack = fs.attack("how to x.", "sure")
            assert attack.forwards == counter.take() and attack.attempts == 2
            judged = FSOUR(
                mixtral,
                tok,
                n_candidates=2,
                max_iters=2,
                judge=lambda p, r: 0.0,
                max_new_tokens=2,
                controller=rc,
                chat_template=False,
            ).attack("how to x.", "sure")
            assert judged.forwards == counter.take() and judged.attempts == 2
            common = dict(
                n_routes=max(len(attack.routes), 1), max_new_tokens=2, chat_template=False, controller=rc
            )
            for budget, batch in ((1, 64), (10, 4), (attack.forwards, 64)):
                control = random_route_search(
                    mixtral, tok, "how to x.", "sure", budget=budget, batch=batch, seed=1, **common
                )
                assert control.forwards == budget == counter.take()
            assert attack.forwards > 64  # the last control ran more than one batch
    finally:
        counter.handle.remove()


def test_fsour_trace_is_the_best_so_far_against_the_forwards_spent(mixtral, tok):
    """The trace behind the forward-pass curves: an entry each time the best objective over attempts rises, at the
    number of sequences scored so far (replayed from each attempt's per-coordinate objectives: the attack's first
    forward, then per attempt 1 + N per coordinate); its routes give its objective through the independent float64
    patch; the last entry is the attack's result; ``best_within`` reads the state at any budget."""
    n = 3
    fs = FSOUR(mixtral, tok, n_candidates=n, max_iters=3, threshold=-1e-12, max_new_tokens=2, chat_template=False)
    a = fs.attack("how to x.", "sure")
    expected, spent, best = [(1, a.trace[0][1])], 1, a.trace[0][1]
    for attempt in range(a.attempts):
        *_, used, history = fs.search("how to x.", "sure", seed=attempt)
        for i, j in enumerate(history[1:], 1):
            if j > best:
                best = j
                expected.append((spent + 1 + n * i, j))
        spent += used
    assert spent == a.forwards and len(expected) > 2
    assert [(f, j) for f, j, _ in a.trace] == expected
    assert a.trace[-1][1:] == (a.logprob, a.routes) and a.trace[0][2] == {}
    info = find_routers(mixtral)[0]
    modules = {i.layer: i.module for i in find_routers(mixtral)}
    p_ids, t_ids = encode(tok, "how to x."), encode(tok, "sure", "target")
    for _, j, routes in a.trace[1:]:
        with torch.no_grad(), patched_routes(modules, routes, top_k=info.top_k, renormalize=info.renormalize):
            logits = mixtral(input_ids=torch.tensor([p_ids + t_ids])).logits[0, len(p_ids) - 1 : -1].double()
        assert float(torch.log_softmax(logits, -1).gather(-1, torch.tensor(t_ids)[:, None]).sum()) == pytest.approx(
            j, abs=1e-4
        )
    for prev, entry in zip(a.trace, a.trace[1:], strict=False):
        assert best_within(a, entry[0]) == entry and best_within(a, entry[0] - 1) == prev
    assert best_within(a, 10**9) == a.trace[-1] and best_within(a, 1) == a.trace[0]
    with pytest.raises(ValueError, match="budget"):
        best_within(a, 0)
    with pytest.raises(ValueError, match="trace"):
        best_within(dataclasses.replace(a, trace=[]), 5)


@pytest.mark.parametrize("batch", [1, 4, 64])
def test_random_search_trace_marks_each_rise_at_the_row_that_reached_it(mixtral, tok, monkeypatch, batch):
    """Every scored row's objective, recorded where the model scored it: the trace has an entry at row r + 1 exactly
    when row r beat every row before it, whatever the batch size."""
    scored = []
    original = attack_module.target_logprob

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        scored.extend(out.tolist())
        return out

    monkeypatch.setattr(attack_module, "target_logprob", recording)
    a = random_route_search(
        mixtral, tok, "how to x.", "sure", n_routes=3, budget=10, batch=batch, max_new_tokens=2, chat_template=False
    )
    expected, best = [], -np.inf
    for r, v in enumerate(scored):
        if v > best:
            best = v
            expected.append((r + 1, v))
    assert len(scored) == 10 and [(f, j) for f, j, _ in a.trace] == expected
    assert a.trace[-1][1:] == (a.logprob, a.routes)
