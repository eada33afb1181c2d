"""Route control: the router rule against a float64 oracle, forcing / masking on three MoE families, bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from icml26.common.tiny_lm import load_lab_model, save_lab_model, tiny_causal_lm
from icml26.unsafe_moe import FSOUR, RouteDropout, RouterController, disable_routes, find_routers, route
from icml26.unsafe_moe.reference import masked_route

IDS = torch.tensor([[9, 10, 11, 12, 13, 14]])


def test_route_matches_the_float64_oracle():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 6, generator=g)
    mask = torch.rand(7, 6, generator=g) < 0.4
    mask[:, 0] = False  # every token keeps at least one expert
    for renormalize in (True, False):
        w, idx = route(logits, 2, renormalize, mask)
        w_ref, idx_ref = masked_route(
            logits.double().tolist(), mask.tolist(), top_k=2, renormalize=renormalize
        )
        kept = [row for row in range(7) if (~mask[row]).sum() >= 2]  # ties among -inf picks are arbitrary
        assert idx[kept].tolist() == [idx_ref[r] for r in kept]
        torch.testing.assert_close(w.double(), torch.tensor(w_ref, dtype=torch.float64), atol=1e-6, rtol=1e-6)


def test_hand_computed_routing_weights():
    # softmax([2, 0] kept of [2, 1, 0, -1]) = [e^2, 1] / (e^2 + 1)
    w, idx = route(torch.tensor([[2.0, 1.0, 0.0, -1.0]]), 2, True, torch.tensor([[False, True, False, True]]))
    assert idx.tolist() == [[0, 2]]
    assert w[0, 0].item() == pytest.approx(math_e2 := 7.38905609893065 / 8.38905609893065, rel=1e-6)
    assert w[0, 1].item() == pytest.approx(1 - math_e2, rel=1e-5)


def test_find_routers_reads_each_family(moe):
    infos = find_routers(moe)
    assert [i.layer for i in infos] == [0, 1]
    assert all(i.num_experts == 4 and i.top_k == 2 for i in infos)
    family = type(moe).__name__
    # Mixtral always renormalises; the lab's Qwen2-MoE has norm_topk_prob=False; OLMoE's default is False
    assert infos[0].renormalize is (family == "MixtralForCausalLM")
    assert infos[0].shared_expert is (family == "Qwen2MoeForCausalLM")


def test_no_rules_leave_the_model_unchanged_and_close_removes_hooks(moe):
    with torch.no_grad():
        base = moe(IDS).logits
        with RouterController(moe) as rc:
            torch.testing.assert_close(moe(IDS).logits, base, rtol=0, atol=0)
            assert rc.routes()[0].shape == (1, 6, 2)
            rc.force(0, 2, [0, 1])
        assert not moe.model.layers[0].mlp.gate._forward_hooks
        torch.testing.assert_close(moe(IDS).logits, base, rtol=0, atol=0)


def test_force_sets_the_route_at_that_token_only(moe):
    with torch.no_grad(), RouterController(moe) as rc:
        moe(IDS)
        default = rc.routes()
        target = [e for e in range(4) if e not in default[1][0, 3].tolist()][:2]
        rc.force(1, 3, target)
        moe(IDS)
        forced = rc.routes()
    assert sorted(forced[1][0, 3].tolist()) == sorted(target)
    others = [t for t in range(6) if t != 3]
    assert torch.equal(
        forced[1][0, others], default[1][0, others]
    )  # same layer inputs, other tokens untouched
    assert torch.equal(forced[0], default[0])  # earlier layer untouched


def test_forced_router_output_matches_the_oracle(mixtral):
    info = find_routers(mixtral)[0]
    h = torch.randn(5, info.module.weight.shape[1], generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), RouterController(mixtral) as rc:
        rc.force(0, "prefill", [1, 3])
        logits, w, idx = info.module(h)
    raw = torch.nn.functional.linear(h, info.module.weight).double().tolist()
    phi = [[e not in (1, 3) for e in range(4)] for _ in range(5)]
    w_ref, idx_ref = masked_route(raw, phi, top_k=2, renormalize=True)
    assert idx.tolist() == idx_ref
    torch.testing.assert_close(w.double(), torch.tensor(w_ref, dtype=torch.float64), atol=1e-6, rtol=1e-5)
    assert torch.isinf(logits[:, [0, 2]]).all()


def test_per_row_candidates_and_decode_steps(mixtral):
    cands = torch.tensor([[0, 1], [2, 3], [1, 2]])
    with torch.no_grad(), RouterController(mixtral) as rc:
        mixtral(IDS[:, :1])
        decode_default = rc.routes()[0].clone()
        rc.force(0, 0, cands)
        mixtral(IDS.expand(3, -1))
        rows = rc.routes()[0][:, 0].sort(-1).values
        rc.clear()
        rc.force(0, 0, [2, 3])
        mixtral(IDS[:, :1])  # a one-token call is a decode step: positional rules do not apply
        assert torch.equal(rc.routes()[0], decode_default)
    assert rows.tolist() == cands.tolist()


def test_masking_and_the_defence(mixtral):
    with torch.no_grad(), RouterController(mixtral) as rc:
        base = mixtral(IDS).logits
        default = rc.routes()[1]
        rc.mask(1, [0, 1], hard=True)
        mixtral(IDS)
        assert not set(rc.routes()[1].flatten().tolist()) & {0, 1}
        rc.force(1, 2, [0, 1])  # an attack onto banned experts: the hard rule wins
        mixtral(IDS)
        assert not set(rc.routes()[1][0, 2].tolist()) & {0, 1}
        rc.clear()
        assert not set(rc.routes()[1].flatten().tolist()) & {0, 1}  # clear() keeps hard rules...
        rc.clear(hard=True)  # ...until asked
        torch.testing.assert_close(mixtral(IDS).logits, base, rtol=0, atol=0)
        used = sorted(set(default[0, 4].tolist()))
        unused = [e for e in range(4) if e not in used]
        disable_routes(mixtral, {1: used + unused[:1]}, controller=rc)  # spare_default: default routes kept
        torch.testing.assert_close(mixtral(IDS).logits, base)  # Mixtral renormalises: same up to rounding
        assert torch.equal(rc.routes()[1], default)
        rc.force(1, 4, unused)  # deviating into a banned expert is disabled
        mixtral(IDS)
        assert unused[0] not in rc.routes()[1][0, 4].tolist()


@pytest.mark.parametrize("family", ["mixtral", "olmoe", "qwen2_moe"])
def test_from_pretrained_checkpoint(tmp_path, tok, family, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tiny_causal_lm(len(tok), family=family, layers=2, hidden=32, experts=4, top_k=2, seed=2).eval()
    loaded, tok2 = load_lab_model(save_lab_model(model, tok, tmp_path / family))
    loaded.eval()
    with torch.no_grad(), RouterController(loaded) as rc:
        loaded(IDS)
        default = rc.routes()[1][0, 3].sort().values.tolist()
        other = [e for e in range(4) if e not in default]
        rc.force(1, 3, other)  # the hook works on the reloaded model: the chosen experts change
        loaded(IDS)
        assert rc.routes()[1][0, 3].sort().values.tolist() == other
    # the reloaded model is searched exactly as the original one (same seed, same routes and objective)
    fs = dict(n_candidates=3, threshold=-1e-12, chat_template=False)
    a = FSOUR(model, tok, **fs).search("how to x.", "sure", seed=1)
    b = FSOUR(loaded, tok2, **fs).search("how to x.", "sure", seed=1)
    assert a[0] == b[0] and a[1] == pytest.approx(b[1], abs=1e-5) and a[2] == b[2]


class _BiasedTopKRouter(nn.Module):
    """A router whose rule adds a score-correction bias before top-k (DeepSeek-V3 style): not supported."""

    def __init__(self):
        super().__init__()
        self.top_k, self.weight = 2, nn.Parameter(torch.randn(4, 8))
        self.register_buffer("bias", torch.tensor([5.0, 0.0, 0.0, -5.0]))

    def forward(self, h):
        logits = h.reshape(-1, 8) @ self.weight.T
        probs = logits.softmax(-1)
        idx = (probs + self.bias).topk(2, -1).indices
        return logits, probs.gather(-1, idx), idx


def test_bad_input(tok, mixtral):
    dense = tiny_causal_lm(len(tok), family="llama", layers=1, hidden=32, seed=0)
    with pytest.raises(TypeError, match="LlamaForCausalLM has no mixture-of-experts router"):
        RouterController(dense)
    with pytest.raises(TypeError, match="_BiasedTopKRouter routes by a rule other than"):
        find_routers(nn.ModuleDict({"layers": nn.ModuleList([_BiasedTopKRouter()])}))
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        find_routers("mixtral")
    with RouterController(mixtral) as rc:
        with pytest.raises(RuntimeError, match="another RouterController"):
            RouterController(mixtral)
        with pytest.raises(ValueError, match=r"expert ids must be in \[0, 4\)"):
            rc.force(0, 1, [1, 4])
        with pytest.raises(ValueError, match="layer 7 has no router"):
            rc.force(7, 1, [1, 2])
        with pytest.raises(ValueError, match="non-empty"):
            rc.force(0, 1, [])
        with pytest.raises(TypeError, match="integer expert ids"):
            rc.force(0, 1, [1.5, 2.0])
        with pytest.raises(ValueError, match="non-negative ints"):
            rc.force(0, -1, [1, 2])
        with pytest.raises(ValueError, match="leaves fewer than top_k=2"):
            rc.mask(0, [0, 1, 2], hard=True)
        with pytest.raises(ValueError, match=r"shape \(T, 4\)"):
            rc.set_phi(0, torch.zeros(3, 5, dtype=torch.bool))


def test_shared_expert_cannot_be_forced(tok):
    qwen = tiny_causal_lm(len(tok), family="qwen2_moe", layers=1, hidden=32, experts=4, top_k=2, seed=0)
    with RouterController(qwen) as rc, pytest.raises(ValueError, match="shared expert is not routed"):
        rc.force(0, 0, [4])


def test_positional_rules_skip_one_token_decode_steps(mixtral):
    """A route forced at a prompt position (or on the whole prefill) must not act on a one-token decode call,
    whose only position is the newest generated token; a rule without positions acts on every call."""
    with torch.no_grad(), RouterController(mixtral) as rc:
        mixtral(IDS[:, :1])
        default = {layer: r.clone() for layer, r in rc.routes().items()}
        for layer in (0, 1):
            other = [e for e in range(4) if e not in default[layer][0, 0].tolist()]
            rc.force(layer, 0, other)
            rc.force(layer, "prefill", other)
        mixtral(IDS[:, :1])
        assert all(torch.equal(rc.routes()[layer], default[layer]) for layer in (0, 1))
        mixtral(IDS[:, :2])  # a two-token call is a prefill: the rules act
        assert sorted(rc.routes()[0][0, 0].tolist()) == [e for e in range(4) if e not in default[0][0, 0].tolist()]
        rc.clear()
        other = [e for e in range(4) if e not in default[1][0, 0].tolist()]
        rc.mask(1, default[1][0, 0].tolist())  # no positions: every call, decode steps included
        mixtral(IDS[:, :1])
        assert sorted(rc.routes()[1][0, 0].tolist()) == other


def _captured(infos):
    """Forward hooks (registered after any others) that keep each router's (logits, weights, indices)."""
    seen, handles = [], []
    for info in infos:
        handles.append(info.module.register_forward_hook(lambda m, a, out: seen.append(out)))
    return seen, handles


def test_route_dropout_replaces_routes_with_the_drawn_subsets(moe):
    # rate 1: every token of every router runs exactly the random top_k-subset drawn from the seeded generator, with
    # the router's weights recomputed on it (float64 oracle); the logits for the load-balancing loss are unmasked
    import copy

    model = copy.deepcopy(moe).train()
    infos = find_routers(model)
    with RouteDropout(model, 1.0, seed=3) as rd:
        assert [i.renormalize for i in find_routers(model)] == [i.renormalize for i in infos]  # rule read in eval
        seen, handles = _captured(infos)
        model(IDS)
        for h in handles:
            h.remove()
    replay = torch.Generator().manual_seed(3)
    n = IDS.shape[1]
    for info, (logits, weights, idx) in zip(infos, seen, strict=True):
        assert torch.rand(n, generator=replay).lt(1.0).all()
        subsets = torch.argsort(torch.rand(n, info.num_experts, generator=replay), dim=-1)[:, : info.top_k]
        assert idx.sort(-1).values.tolist() == subsets.sort(-1).values.tolist()
        mask = torch.ones(n, info.num_experts, dtype=torch.bool).scatter_(-1, subsets, False)
        w_ref, idx_ref = masked_route(logits.double().tolist(), mask.tolist(), top_k=info.top_k,
                                      renormalize=info.renormalize)
        assert idx.tolist() == idx_ref
        torch.testing.assert_close(weights.double(), torch.tensor(w_ref, dtype=torch.float64), atol=1e-6, rtol=1e-6)
        assert torch.isfinite(logits).all()  # unmasked: the aux loss sees the router's own preference
    assert (rd.dropped, rd.seen) == (n * len(infos), n * len(infos))


def test_route_dropout_rate_zero_and_eval_mode_leave_the_model_unchanged(moe):
    import copy

    model = copy.deepcopy(moe)
    with torch.no_grad():
        base = model.eval()(IDS).logits
        with RouteDropout(model, 1.0, seed=0) as rd:
            torch.testing.assert_close(model(IDS).logits, base, rtol=0, atol=0)  # eval mode: untouched
            assert rd.seen == 0
        model.train()
        train_base = model(IDS).logits
        with RouteDropout(model, 0.0, seed=0):
            torch.testing.assert_close(model(IDS).logits, train_base, rtol=0, atol=0)
        with RouteDropout(model, 1.0, seed=0):
            assert not torch.equal(model(IDS).logits, train_base)
        torch.testing.assert_close(model(IDS).logits, train_base, rtol=0, atol=0)  # hooks removed on exit


def test_route_dropout_rate_is_the_share_of_tokens_replaced_and_the_router_still_learns(mixtral):
    import copy

    from scipy import stats

    model = copy.deepcopy(mixtral).train()
    infos = find_routers(model)
    ids = torch.randint(5, 40, (8, 50), generator=torch.Generator().manual_seed(0))
    with RouteDropout(model, 0.3, seed=1) as rd:
        seen, handles = _captured(infos)
        model(ids).logits.square().mean().backward()
        for h in handles:
            h.remove()
    # 800 token-router draws at rate 0.3: the count lies in the binomial's central 99.9 %
    lo, hi = stats.binom.ppf([0.0005, 0.9995], rd.seen, 0.3)
    assert rd.seen == 800 and lo <= rd.dropped <= hi
    # replayed draws: a dropped token runs its drawn subset, every other token its router's own top-k
    replay = torch.Generator().manual_seed(1)
    for info, (logits, _, idx) in zip(infos, seen, strict=True):
        drop = torch.rand(400, generator=replay) < 0.3
        subsets = torch.argsort(torch.rand(400, info.num_experts, generator=replay), dim=-1)[:, : info.top_k]
        own = torch.topk(torch.softmax(logits.detach().float(), -1), info.top_k, dim=-1).indices
        chosen = torch.where(drop[:, None], subsets, own)
        assert idx.sort(-1).values.tolist() == chosen.sort(-1).values.tolist()
    assert all(float(i.module.weight.grad.abs().sum()) > 0 for i in find_routers(model))


def test_route_dropout_bad_input(mixtral):
    for rate in (-0.1, 1.5, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match="rate"):
            RouteDropout(mixtral, rate)
    with pytest.raises(TypeError, match="seed"):
        RouteDropout(mixtral, 0.5, seed=1.5)
    with pytest.raises(TypeError, match="router"):
        RouteDropout(nn.Linear(3, 3), 0.5)
