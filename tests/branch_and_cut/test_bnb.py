"""The exact B&B, the policies, the oracle and the families: pinned tree sizes and independent oracles."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from icml26.branch_and_cut import (
    MILP,
    DeviatingPolicy,
    LearnedPolicy,
    LPBoundImprovement,
    LPOracle,
    MostFractional,
    PerturbedPolicy,
    Proxy,
    StrongBranching,
    TreeSizeAware,
    closed_form_jeroslow_sb,
    cut_selection_family,
    min_tree_size,
    objective_orthogonality,
    pick,
    rhs_perturbed_cut,
    sb_suboptimal_family,
    score_gap_family,
    solve_bnb,
    tie_breaking_family,
)
from icml26.branch_and_cut.bnb import _fractional
from icml26.branch_and_cut.reference import brute_min_tree


@pytest.mark.parametrize("n", [3, 5, 7])
def test_family_a_tie_breaking_pinned(n):
    a = tie_breaking_family(n)
    assert solve_bnb(a, StrongBranching(tie_break="index")).nodes == closed_form_jeroslow_sb(n)
    assert solve_bnb(a, StrongBranching(tie_break="reverse")).nodes == 11
    assert min_tree_size(a) == 11
    assert solve_bnb(a, StrongBranching()).status == "infeasible"


def test_closed_form_values():
    assert [closed_form_jeroslow_sb(n) for n in (5, 7, 9, 11, 13)] == [39, 139, 503, 1847, 6863]
    with pytest.raises(ValueError, match="odd"):
        closed_form_jeroslow_sb(4)


def test_family_b_sb_is_exponentially_suboptimal():
    sizes = [solve_bnb(sb_suboptimal_family(n), StrongBranching()).nodes for n in (5, 7)]
    fixing = [solve_bnb(sb_suboptimal_family(n), StrongBranching(), sb_fixing=True).nodes for n in (5, 7)]
    assert sizes == [39, 139] and fixing == [11, 39]
    assert min_tree_size(sb_suboptimal_family(7)) == 11
    tree_aware = TreeSizeAware(sb_suboptimal_family(7))
    assert solve_bnb(sb_suboptimal_family(7), tree_aware).nodes == 11


def test_family_d_rhs_perturbation():
    for n in (5, 7):
        exact, cutoff = rhs_perturbed_cut(n, 0.0)
        pert, _ = rhs_perturbed_cut(n, 1e-3)
        assert solve_bnb(exact, StrongBranching(), cutoff=cutoff).nodes == 1
        assert min_tree_size(exact, cutoff=cutoff) == 1
        assert solve_bnb(pert, StrongBranching(), cutoff=cutoff).nodes == closed_form_jeroslow_sb(n)
        assert min_tree_size(pert, cutoff=cutoff) == closed_form_jeroslow_sb(n)
    # without the cutoff the incumbent is found and the optimum is (n-1)/2
    s = solve_bnb(rhs_perturbed_cut(5, 1e-3)[0], StrongBranching())
    assert s.status == "optimal" and s.objective == pytest.approx(2.0)


def test_family_e_cut_selection():
    m, cands = cut_selection_family(7)
    by_bound = LPBoundImprovement(k=3).select(m, cands)
    by_proxy = Proxy(objective_orthogonality, k=3).select(m, cands)
    assert {c.name[0] for c in by_bound} == {"x"} and {c.name[0] for c in by_proxy} == {"z"}
    gains = LPBoundImprovement().scores(m, cands)
    assert all(g > 0 for g in gains[:3]) and all(g == pytest.approx(0) for g in gains[3:])
    assert solve_bnb(m.add_cuts(by_bound), StrongBranching(), sb_fixing=True).nodes == 13
    assert solve_bnb(m.add_cuts(by_proxy), StrongBranching(), sb_fixing=True).nodes == 1


def _random_milp(rng, n=6, sense="min"):
    a = rng.integers(-3, 6, size=(3, n)).astype(float)
    b = a.clip(min=0).sum(1) * 0.5 + 1
    ub = rng.integers(1, 4, size=n).astype(float)
    integ = (rng.random(n) < 0.7).astype(float)
    return MILP(rng.normal(size=n).round(3), A_ub=a, b_ub=b, lb=np.zeros(n), ub=ub, integrality=integ, sense=sense)


@pytest.mark.parametrize("seed", range(6))
def test_optimum_matches_scipy_milp(seed):
    rng = np.random.default_rng(seed)
    m = _random_milp(rng, sense="min" if seed % 2 else "max")
    ours = solve_bnb(m, MostFractional())
    c = m.min_objective()
    ref = milp(c, constraints=LinearConstraint(m.A_ub, -np.inf, m.b_ub), bounds=Bounds(m.lb, m.ub),
               integrality=m.integrality.astype(int))
    assert ours.status == "optimal" and ref.success
    sign = 1 if m.sense == "min" else -1
    assert ours.objective == pytest.approx(sign * ref.fun, abs=1e-6)
    assert len(_fractional(m, ours.x)) == 0


def test_min_tree_oracle_against_brute_force():
    for n in (1, 3):
        m = tie_breaking_family(n)
        assert min_tree_size(m) == brute_min_tree(m, m.lb, m.ub, LPOracle(m))
    m = MILP([0.0] * 4, A_eq=[[2, 2, 2, 2]], b_eq=[3], ub=[1, 1, 1, 1])
    assert min_tree_size(m) == brute_min_tree(m, m.lb, m.ub, LPOracle(m))
    with pytest.raises(ValueError, match="exceed max_n=4"):
        min_tree_size(tie_breaking_family(5), max_n=4)


def test_ties_are_within_a_relative_tolerance_not_exact():
    """Scores that differ only by LP round-off (1e-12 relative) are a tie; a clear gap (1e-6) is not."""
    cands = np.array([2, 5, 7])
    assert pick(np.array([1.0, 1.0 - 1e-12, 0.5]), cands, "reverse") == 5
    assert pick(np.array([1.0, 1.0 - 1e-6, 0.5]), cands, "reverse") == 2
    assert pick(np.array([-2.0, -2.0 * (1 + 1e-12), -3.0]), cands, "reverse") == 5


def test_a_node_no_better_than_the_cutoff_is_pruned():
    """B&B prunes a node whose LP bound only ties the cutoff: an equally good point does not *beat* it."""
    m = MILP([1.0, 1.0], A_ub=[[-1.0, -1.0]], b_ub=[-1.0], ub=[3, 3])  # min x0 + x1, x0 + x1 >= 1: LP integral, 1
    assert solve_bnb(m, StrongBranching()).objective == pytest.approx(1.0)
    tied = solve_bnb(m, StrongBranching(), cutoff=1.0)
    assert (tied.status, tied.objective, tied.nodes) == ("infeasible", None, 1)
    better = solve_bnb(m, StrongBranching(), cutoff=1.5)
    assert better.status == "optimal" and better.objective == pytest.approx(1.0)


def test_pick_and_perturbations():
    cands = np.array([2, 5, 7])
    assert pick(np.array([1.0, 1.0, 0.5]), cands, "index") == 2
    assert pick(np.array([1.0, 1.0, 0.5]), cands, "reverse") == 5
    assert pick(np.array([0.0, 0.0, 0.0]), cands, np.random.default_rng(0)) in {2, 5, 7}
    with pytest.raises(ValueError, match="tie_break"):
        pick(np.zeros(3), cands, "middle")
    with pytest.raises(ValueError, match="non-finite"):
        pick(np.array([np.nan, 0, 0]), cands, "index")
    a = tie_breaking_family(5)
    bonus = np.array([1.0 if s.startswith("x") else 0.0 for s in a.names])
    # a 1e-15 nudge on scores that tie at 1e-12 turns 11 nodes into 39
    assert solve_bnb(a, PerturbedPolicy(StrongBranching(tie_break="reverse"), 1e-15, bonus=bonus)).nodes == 39
    r1 = solve_bnb(a, PerturbedPolicy(StrongBranching(), 1e-15, seed=3)).nodes
    assert r1 == solve_bnb(a, PerturbedPolicy(StrongBranching(), 1e-15, seed=3)).nodes


@pytest.mark.parametrize("n", [5, 7])
def test_family_c_score_perturbation_without_ties(n):
    """Distinct scores everywhere; a relative nudge of twice the root margin flips one decision: 11 -> J_n's tree."""
    margin = 1e-6
    c = score_gap_family(n, margin)
    exact = solve_bnb(c, StrongBranching())
    assert (exact.nodes, exact.ties) == (11, 0)
    # the root's two candidates: x_m with gains 1/(2n) on both sides, z2 with 1/(2n) and (1 + margin)/(2n)
    lp = LPOracle(c)
    root = lp.solve(c.lb, c.ub)
    frac = _fractional(c, root.x)
    assert [c.names[j] for j in frac] == [f"x{(n + 1) // 2}", "z2"]
    from icml26.branch_and_cut.bnb import Node

    s = StrongBranching().scores(Node(c.lb.copy(), c.ub.copy(), root, 0, frac), lp)
    assert s[1] / s[0] == pytest.approx(1 + margin, rel=1e-6)          # z2 wins by the margin: no tie
    bonus = np.array([1.0 if name.startswith("x") else 0.0 for name in c.names])
    policy = PerturbedPolicy(StrongBranching(), 2 * margin, bonus=bonus, relative=True)
    perturbed = solve_bnb(c, policy)
    assert perturbed.nodes == closed_form_jeroslow_sb(n) and perturbed.ties == 0
    assert policy.differences == 1 and policy.decisions == len(perturbed.branched)
    # a nudge smaller than the margin changes nothing
    small = PerturbedPolicy(StrongBranching(), margin / 2, bonus=bonus, relative=True)
    assert solve_bnb(c, small).nodes == 11 and small.differences == 0
    # the minimum tree is the 11 nodes SB finds unperturbed
    assert min_tree_size(c) == 11


@pytest.mark.parametrize("n", [5, 7])
def test_one_decision_difference_is_exponential(n):
    c = score_gap_family(n, 0.5)
    assert solve_bnb(c, StrongBranching()).nodes == 11
    assert solve_bnb(c, DeviatingPolicy(StrongBranching(), deviations=0)).nodes == 11
    policy = DeviatingPolicy(StrongBranching(), deviations=1)
    stats = solve_bnb(c, policy)
    assert policy.differences == 1 and stats.nodes == closed_form_jeroslow_sb(n)
    # the deviation is the root's runner-up (the x variable), everything after is SB's own choice
    assert c.names[stats.branched[0]].startswith("x")


def test_ties_are_counted():
    assert solve_bnb(tie_breaking_family(5), StrongBranching()).ties > 0     # every family-A score ties
    assert solve_bnb(sb_suboptimal_family(5), StrongBranching()).ties == 0
    with pytest.raises(ValueError, match="margin"):
        score_gap_family(5, 1.0)
    with pytest.raises(ValueError, match="deviations"):
        DeviatingPolicy(StrongBranching(), deviations=-1)


def test_learned_policy_imitates_scores():
    from sklearn.linear_model import LinearRegression

    m = sb_suboptimal_family(5)
    x = np.array([[0.5, 1.2, 1.2, 1, 0, 0], [0.5, 0.0, 0.0, 1, 0, 0]])
    model = LinearRegression().fit(x, [3.0, -12.0])
    with pytest.raises(ValueError, match="bind the policy"):
        solve_bnb(m, LearnedPolicy(model))
    assert solve_bnb(m, LearnedPolicy(model).bind(m)).nodes == 39
    with pytest.raises(TypeError, match="predict"):
        LearnedPolicy(object())


class _Bad:
    tie_break = "index"

    def __init__(self, out):
        self.out = out

    def scores(self, node, lp):
        return self.out(node)


class _ChoosesIntegral:
    """A policy that returns a variable that is not LP-fractional at the node."""

    tie_break = "index"

    def choose(self, node, lp):
        return int(next(j for j in range(len(node.lb)) if j not in set(node.candidates.tolist())))


def test_bad_input():
    with pytest.raises(ValueError, match="integrality"):
        MILP([1.0, 1.0], integrality=[1, 2])
    with pytest.raises(ValueError, match="integer bounds"):
        MILP([1.0], ub=[1.5])
    with pytest.raises(ValueError, match="A_ub must have 2 columns"):
        MILP([1.0, 1.0], A_ub=[[1.0]], b_ub=[1.0])
    with pytest.raises(ValueError, match="sense"):
        MILP([1.0], sense="maximize")
    unbounded = MILP([-1.0], lb=[0.0], ub=[np.inf])
    with pytest.raises(ValueError, match="unbounded"):
        solve_bnb(unbounded, MostFractional())
    infeasible = MILP([1.0, 1.0], A_eq=[[1.0, 1.0]], b_eq=[3.0])
    s = solve_bnb(infeasible, MostFractional())
    assert (s.status, s.nodes, s.objective) == ("infeasible", 1, None)
    m = tie_breaking_family(3)
    with pytest.raises(ValueError, match="scores for"):
        solve_bnb(m, _Bad(lambda node: np.zeros(len(node.candidates) + 1)))
    with pytest.raises(ValueError, match="not an LP-fractional"):
        solve_bnb(m, _ChoosesIntegral())
    with pytest.raises(ValueError, match="node_order"):
        solve_bnb(m, MostFractional(), node_order="bfs")
    limited = solve_bnb(tie_breaking_family(7), StrongBranching(), node_limit=10)
    assert (limited.status, limited.nodes) == ("node_limit", 10)


def test_efficacy_is_the_violation_over_the_cuts_norm():
    from icml26.branch_and_cut.cuts import efficacy
    from icml26.branch_and_cut.milp import Cut, LPResult

    root = LPResult("optimal", 0.0, np.array([1.0, 2.0]))
    cut = Cut(np.array([3.0, 4.0]), 1.0)                 # 3 + 8 - 1 = 10 over |(3, 4)| = 5
    assert efficacy(cut, None, root) == pytest.approx(2.0, abs=1e-12)
    scaled = Cut(10 * cut.coef, 10 * cut.rhs)            # the same inequality: the same efficacy
    assert efficacy(scaled, None, root) == pytest.approx(2.0, abs=1e-12)


def test_round_off_is_not_fractional_and_continuous_variables_are_not_candidates():
    m = tie_breaking_family(3)
    x = np.round(np.linspace(0, 1, m.n))
    j = int(np.nonzero(m.integrality)[0][0])
    x[j] += 1e-12                                       # LP round-off next to an integer
    assert len(_fractional(m, x)) == 0
    x[j] += 0.5
    assert _fractional(m, x).tolist() == [j]


def test_objective_orthogonality_ignores_the_cuts_sign():
    from types import SimpleNamespace

    from icml26.branch_and_cut.cuts import objective_orthogonality
    from icml26.branch_and_cut.milp import Cut

    c = np.array([1.0, -2.0, 2.0])
    m = SimpleNamespace(min_objective=lambda: c)        # the score reads only the objective
    assert objective_orthogonality(Cut(c, 0.0), m, None) == pytest.approx(0.0, abs=1e-12)
    assert objective_orthogonality(Cut(np.array([2.0, 1.0, 0.0]), 0.0), m, None) == pytest.approx(1.0, abs=1e-12)
    assert objective_orthogonality(Cut(-c, 0.0), m, None) == pytest.approx(0.0, abs=1e-12)
