r"""FedTreeLoRA's framework-free core: the client tree, the layer-wise cuts, the aggregation, the algorithm.

After ``warmup_rounds`` rounds of local-only LoRA training the server builds **one** client tree and cuts it
**per layer**, shallow to deep, with non-decreasing cluster counts; each client then trains a cluster expert (the
average of its cluster's LoRA at that layer) mixed with a frozen external expert (the average of the others):

$$D^{(l)}_{ij} = \tfrac{1}{|M_l|}\textstyle\sum_{m \in M_l} \big(1 - \cos(B_{m,i}, B_{m,j})\big), \qquad
  D^{glob} = \tfrac{1}{L}\textstyle\sum_l D^{(l)}$$
$$T = \mathrm{AHC}(D^{glob},\ \text{average linkage})$$
$$\Omega_l = \{c : c^*_{l-1} \le c < \min(N, c^*_{l-1} + K)\},\ c^*_0 = 1,\qquad
  \phi(c) = \tau \text{ if } c = 1 \text{ else } \mathrm{silhouette}(\mathrm{cut}(T, c); D^{(l)}),\qquad
  c^*_l = \arg\max_{c \in \Omega_l} \phi(c)$$
$$\bar A^{clus}_{l,k} = \textstyle\sum_{j \in S^{(l)}_k} w_j A_{l,j} / \sum_{j \in S^{(l)}_k} w_j,\quad
  \bar A^{ext}_{l,k} = \text{the same over } R^{(l)}_k = [N] \setminus S^{(l)}_k \quad(\text{and } B \text{ alike})$$

(M_l: the adapted projections of layer l; S_k^(l): client k's cluster at layer l; w_j: its number of training
examples. A and B are averaged separately, as in the paper, not their product.) Ties in phi go to the smaller c
(more sharing). Hierarchical clustering is scipy's (``linkage``, ``cut_tree``); the silhouette is sklearn's.

``FederatedLoRA`` is the shared protocol on ``icml26.common.federation`` (rounds of local training, a server
sharing rule per adapter key, a last evaluation round); ``FedTreeLoRA`` is the method and its ablations
(``cut_rule`` ``"tree"`` / ``"fixed"`` / ``"independent"``, ``external`` on / off); the baselines subclass the same
protocol in ``baselines.py``. Clients train through a duck-typed ``trainer`` (``client.LoRATrainer`` in torch), so
this module needs only numpy, scipy and scikit-learn.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> trunk, fork = rng.normal(size=(6, 2)), rng.normal(size=(2, 6, 2))
    >>> B = {k: [[trunk + 0.05 * rng.normal(size=(6, 2))],                  # layer 0: one shared direction
    ...          [fork[k // 2] + 0.05 * rng.normal(size=(6, 2))]] for k in range(4)}   # layer 1: two branches
    >>> tree = build_client_tree(B)
    >>> select_layer_cuts(tree, tau=0.2, window=3)
    [1, 2]
    >>> [sorted(map(sorted, p)) for p in tree_partitions(tree, [1, 2])]
    [[[0, 1, 2, 3]], [[0, 1], [2, 3]]]

Reference: FedTreeLoRA, "Reconciling Statistical and Functional Heterogeneity in Federated LoRA Fine-Tuning",
Bian, Wang, Zhang, Xu, ICML 2026 (arXiv:2603.13282); the warm-up, tree, cut rule and expert mixing from a
secondary summary of the paper; the distance (1 - cos of B, FedLEASE code) and tau, K defaults are this project's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common.federation import FederatedAlgorithm

DISTANCES = ("cosine", "frobenius")
LINKAGES = ("average", "complete", "single", "weighted")
CUT_RULES = ("tree", "fixed", "independent")


_LAYER_RE = re.compile(r"\.(\d+)\.")


def layer_index(key: str) -> int:
    """The transformer layer of an adapter key or module name: the first dotted integer (``layers.3.`` -> 3)."""
    m = _LAYER_RE.search(key)
    if m is None:
        raise ValueError(f"cannot find a layer index in {key!r} (expected a dotted integer such as 'layers.3.')")
    return int(m.group(1))


def module_of(key: str) -> str:
    """The adapted module's name of a peft key (``base_model.model.<module>.lora_A.weight`` -> ``<module>``)."""
    factor_of(key)
    name = key[len("base_model.model."):] if key.startswith("base_model.model.") else key
    return re.sub(r"\.lora_[AB](?:\.[^.]+)?\.weight$", "", name)


def factor_of(key: str) -> str:
    """``"A"`` or ``"B"``: the LoRA factor of a peft key (``....lora_A.weight``)."""
    m = re.search(r"\.lora_([AB])(?:\.[^.]+)?\.weight$", key)
    if m is None:
        raise ValueError(f"{key!r} is not a peft LoRA factor key (…lora_A.weight / …lora_B.weight)")
    return m.group(1)


_layer_of = layer_index


# ----------------------------------------------------------------------------------------------- distances
def layer_distances(B: Mapping[Hashable, Sequence[Sequence[np.ndarray]]], distance: str = "cosine",
                    eps: float = 1e-12) -> np.ndarray:
    r"""Per-layer client distances ``(L, N, N)`` from the clients' LoRA B matrices.

    $$D^{(l)}_{ij} = \tfrac{1}{|M_l|}\textstyle\sum_m \big(1 - \frac{\langle B_{m,i}, B_{m,j}\rangle}
      {\max(\lVert B_{m,i}\rVert, \epsilon)\,\max(\lVert B_{m,j}\rVert, \epsilon)}\big)$$

    (``distance="frobenius"``: the mean of ``||B_{m,i} - B_{m,j}||_F``). Clients in the order of ``B``'s keys.

    Args:
        B: ``{client: [layer][module] matrix}``; every client needs the same layers, modules and shapes.
        distance: ``"cosine"`` (1 - cosine, FedLEASE's) or ``"frobenius"``.
        eps: guard on the norms (LoRA B starts at zero).
    """
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    ids = list(B)
    if len(ids) < 1:
        raise ValueError("B must hold at least one client")
    shapes = [[tuple(np.shape(m)) for m in layer] for layer in B[ids[0]]]
    if not shapes or any(not layer for layer in shapes):
        raise ValueError("every client needs at least one layer with at least one B matrix")
    for cid in ids:
        got = [[tuple(np.shape(m)) for m in layer] for layer in B[cid]]
        if got != shapes:
            raise ValueError(f"client {cid!r}'s B matrices {got} do not match client {ids[0]!r}'s {shapes} "
                             "(mismatched LoRA ranks or target modules)")
    n, n_layers = len(ids), len(shapes)
    out = np.zeros((n_layers, n, n))
    for layer in range(n_layers):
        for m in range(len(shapes[layer])):
            X = np.stack([np.asarray(B[cid][layer][m], dtype=np.float64).ravel() for cid in ids])
            if not np.all(np.isfinite(X)):
                raise ValueError(f"B of layer {layer} holds NaN or Inf")
            if distance == "cosine":
                norms = np.maximum(np.linalg.norm(X, axis=1), eps)
                U = X / norms[:, None]
                d = 1.0 - U @ U.T
            else:
                sq = (X ** 2).sum(1)
                d = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * X @ X.T, 0.0))
            out[layer] += d / len(shapes[layer])
    out = np.clip((out + out.transpose(0, 2, 1)) / 2.0, 0.0, None)
    idx = np.arange(n)
    out[:, idx, idx] = 0.0
    return out


# ------------------------------------------------------------------------------------------------- the tree
@dataclass(frozen=True)
class ClientTree:
    """One agglomerative merge tree over the clients (scipy linkage matrix) and the distances it came from.

    Attributes:
        ids: client ids, in the order of the distance matrices' rows.
        linkage: scipy's ``(N - 1, 4)`` linkage matrix ``Z``.
        distances: ``D^glob`` (N, N).
        layer_distances: ``D^(l)`` (L, N, N).
    """

    ids: tuple
    linkage: np.ndarray
    distances: np.ndarray
    layer_distances: np.ndarray

    @property
    def n(self) -> int:
        return len(self.ids)

    def cut(self, c: int) -> np.ndarray:
        """Cluster labels (0..c-1, numbered by first appearance) of the tree cut into exactly ``c`` clusters."""
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 1 <= c <= self.n:
            raise ValueError(f"cannot cut {self.n} clients into {c!r} clusters (need 1 <= c <= {self.n}; "
                             "fewer clients than clusters?)")
        if self.n == 1:
            return np.zeros(1, dtype=int)
        from scipy.cluster.hierarchy import cut_tree

        return _canonical(cut_tree(self.linkage, n_clusters=int(c)).ravel())

    def partition(self, c: int) -> list[frozenset]:
        """The cut into ``c`` clusters as sets of client ids."""
        return labels_to_partition(self.ids, self.cut(c))


def _canonical(labels: np.ndarray) -> np.ndarray:
    seen: dict[int, int] = {}
    return np.array([seen.setdefault(int(v), len(seen)) for v in labels], dtype=int)


def labels_to_partition(ids: Sequence[Hashable], labels: Sequence[int]) -> list[frozenset]:
    """Cluster labels as a list of frozensets of ids (in order of first appearance)."""
    groups: dict[int, list] = {}
    for cid, lab in zip(ids, labels, strict=True):
        groups.setdefault(int(lab), []).append(cid)
    return [frozenset(g) for g in groups.values()]


def _linkage(D: np.ndarray, method: str) -> np.ndarray:
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    if method not in LINKAGES:
        raise ValueError(f"linkage must be one of {LINKAGES}, got {method!r}")
    if len(D) < 2:
        return np.zeros((0, 4))
    return linkage(squareform(D, checks=False), method=method)


def build_client_tree(B: Mapping[Hashable, Sequence[Sequence[np.ndarray]]], distance: str = "cosine",
                      linkage: str = "average") -> ClientTree:
    """The global client tree: agglomerative clustering of the layer-averaged B distances.

    Args:
        B: ``{client: [layer][module] B matrix}`` after warm-up.
        distance: see ``layer_distances``.
        linkage: scipy linkage method (``"average"`` as in FedLEASE).
    """
    Dl = layer_distances(B, distance)
    D = Dl.mean(axis=0)
    return ClientTree(tuple(B), _linkage(D, linkage), D, Dl)


def silhouette(D: np.ndarray, labels: np.ndarray) -> float:
    """sklearn's silhouette score on a precomputed distance matrix (defined for 2 <= c <= N - 1)."""
    from sklearn.metrics import silhouette_score

    return float(silhouette_score(D, labels, metric="precomputed"))


def cut_score(tree: ClientTree, c: int, D: np.ndarray, tau: float) -> float:
    r"""$$\phi(c; D) = \tau \text{ if } c = 1 \text{ else silhouette}(\mathrm{cut}(T, c); D)$$"""
    if c == 1:
        return float(tau)
    return silhouette(D, tree.cut(c))


def _check_tau_window(tau: float, window: int) -> None:
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and -1.0 <= tau <= 1.0):
        raise ValueError(f"tau must be a finite number in [-1, 1] (a silhouette score), got {tau!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")


def select_layer_cuts(tree: ClientTree, tau: float = 0.2, window: int = 3,
                      layer_distances: np.ndarray | None = None) -> list[int]:
    r"""The monotone per-layer cluster counts c*_l, shallow to deep.

    $$\Omega_l = \{c : c^*_{l-1} \le c < \min(N, c^*_{l-1} + K)\},\quad c^*_l = \arg\max_{c\in\Omega_l}\phi(c; D^{(l)})$$

    Args:
        tree: the global tree.
        tau: the score of "no split" (c = 1); a split must have a silhouette above it.
        window: K, how far the count may grow from one layer to the next (c grows by at most K - 1).
        layer_distances: ``D^(l)`` to score with (default: the tree's own).
    """
    _check_tau_window(tau, window)
    Dl = tree.layer_distances if layer_distances is None else np.asarray(layer_distances, dtype=float)
    if Dl.ndim != 3 or Dl.shape[1:] != (tree.n, tree.n):
        raise ValueError(f"layer_distances must have shape (L, {tree.n}, {tree.n}), got {Dl.shape}")
    prev, cuts = 1, []
    for D in Dl:
        # $$\Omega_l = \{c : c^*_{l-1} \le c < \min(N, c^*_{l-1} + K)\}$$
        omega = list(range(prev, min(tree.n, prev + window))) or [prev]
        scores = [cut_score(tree, c, D, tau) for c in omega]
        # $$c^*_l = \arg\max_{c \in \Omega_l} \phi(c; D^{(l)})$$  (first maximum: ties go to more sharing)
        prev = omega[int(np.argmax(scores))]
        cuts.append(prev)
    return cuts


def tree_partitions(tree: ClientTree, cuts: Sequence[int]) -> list[list[frozenset]]:
    """Per layer, the partition of the clients given by cutting the one tree into ``cuts[l]`` clusters."""
    return [tree.partition(int(c)) for c in cuts]


def independent_partitions(layer_dist: np.ndarray, ids: Sequence[Hashable], tau: float = 0.2,
                           linkage: str = "average") -> tuple[list[int], list[list[frozenset]]]:
    """The ablation "independent per-layer clustering": a tree per layer, c by silhouette over 1..N-1 (tau for 1).

    No shared tree and no monotone constraint, so groupings may jump between layers ("topological drift").
    """
    _check_tau_window(tau, 1)
    cuts, parts = [], []
    for D in np.asarray(layer_dist, dtype=float):
        tree = ClientTree(tuple(ids), _linkage(D, linkage), D, D[None])
        omega = list(range(1, max(2, tree.n)))
        c = omega[int(np.argmax([cut_score(tree, c, D, tau) for c in omega]))]
        cuts.append(c)
        parts.append(tree.partition(c))
    return cuts, parts


def flat_partition(tree: ClientTree, tau: float = 0.2) -> tuple[int, list[frozenset]]:
    """One partition for all layers: the tree cut with the best silhouette on ``D^glob`` (tau for c = 1)."""
    _check_tau_window(tau, 1)
    omega = list(range(1, max(2, tree.n)))
    c = omega[int(np.argmax([cut_score(tree, c, tree.distances, tau) for c in omega]))]
    return c, tree.partition(c)


def place_client(B_new: Sequence[Sequence[np.ndarray]], B: Mapping[Hashable, Sequence[Sequence[np.ndarray]]],
                 partitions: Sequence[Sequence[frozenset]], distance: str = "cosine") -> list[frozenset]:
    r"""Where a client that took no part in training joins a nested per-layer partition (unseen clients).

    Its warm-up B matrices ``B_new`` are compared with the training clients' warm-up ``B`` under the tree's
    layer-averaged distance; it joins the block of the finest (deepest) partition at the smallest average
    distance (the tree's average linkage), and at every shallower layer the block that contains that one:

    $$k^* = \arg\min_{S \in P_{L}} \tfrac{1}{|S|}\textstyle\sum_{j \in S} D^{glob}_{new, j},\qquad
      S^{(l)}_{new} = \text{the block of } P_l \supseteq k^*$$

    Args:
        B_new: the new client's ``[layer][module]`` B matrices (same shapes as the training clients').
        B: ``{client: [layer][module] B}`` of the training clients (the tree's input).
        partitions: per layer, a partition of ``B``'s clients; each must refine the one before (the tree's cuts
            with non-decreasing counts; flat clustering's identical partitions).
        distance: as ``layer_distances``.
    Returns:
        Per layer, the block (a frozenset of training client ids) whose experts the new client starts from.
    Raises:
        ValueError: partitions that do not cover ``B``'s clients or are not nested shallow to deep.

    Example:
        >>> e = [np.eye(2)[:, :1], np.eye(2)[:, 1:]]
        >>> B = {0: [[e[0]]], 1: [[e[0]]], 2: [[e[1]]]}
        >>> sorted(place_client([[e[1] + 0.1]], B, [[frozenset({0, 1}), frozenset({2})]])[0])
        [2]
    """
    ids = list(B)
    if "__new__" in B:
        raise ValueError("a training client may not be called '__new__'")
    if not partitions:
        raise ValueError("partitions must hold one partition per layer")
    for layer, part in enumerate(partitions):
        members = [c for block in part for c in block]
        if sorted(map(str, members)) != sorted(map(str, ids)) or len(members) != len(ids):
            raise ValueError(f"the partition of layer {layer} does not cover the training clients {ids} once")
        if layer and any(not any(block <= up for up in partitions[layer - 1]) for block in part):
            raise ValueError(f"the partition of layer {layer} does not refine layer {layer - 1}'s (not a tree cut)")
    D = layer_distances({**B, "__new__": B_new}, distance).mean(axis=0)[-1, :-1]
    d = dict(zip(ids, D, strict=True))
    finest = partitions[-1]
    # $$k^* = \arg\min_{S \in P_L} \frac{1}{|S|}\sum_{j \in S} D^{glob}_{new, j}$$ (first minimum: partition order)
    chosen = finest[int(np.argmin([np.mean([d[j] for j in block]) for block in finest]))]
    return [next(block for block in part if chosen <= block) for part in partitions]


def adjusted_rand(labels_true: Sequence[int], labels_pred: Sequence[int]) -> float:
    """sklearn's adjusted Rand index."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(labels_true, labels_pred))


# ---------------------------------------------------------------------------------------------- aggregation
def _check_states(states: Mapping[Hashable, Mapping[str, np.ndarray]]) -> list[str]:
    if not states:
        raise ValueError("states must hold at least one client")
    ids = list(states)
    keys = sorted(states[ids[0]])
    for cid in ids:
        if sorted(states[cid]) != keys:
            diff = sorted(set(states[cid]) ^ set(keys))[:3]
            raise ValueError(f"client {cid!r}'s LoRA keys differ from client {ids[0]!r}'s ({diff}...): "
                             "mismatched target modules")
        for k in keys:
            a, b = np.shape(states[cid][k]), np.shape(states[ids[0]][k])
            if a != b:
                raise ValueError(f"client {cid!r}'s {k} has shape {a}, client {ids[0]!r}'s {b}: mismatched LoRA ranks")
            if not np.all(np.isfinite(states[cid][k])):
                raise ValueError(f"client {cid!r}'s {k} holds NaN or Inf")
    return keys


def weighted_mean(arrays: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """sum_j w_j X_j / sum_j w_j in float64, returned as float32 (the order of ``arrays`` fixes the sum)."""
    w = np.asarray(weights, dtype=np.float64)
    acc = np.zeros(np.shape(arrays[0]), dtype=np.float64)
    for x, wi in zip(arrays, w, strict=True):
        acc += wi * np.asarray(x, dtype=np.float64)
    return (acc / w.sum()).astype(np.float32)


def aggregate_tree_lora(states: Mapping[Hashable, Mapping[str, np.ndarray]],
                        partitions: Mapping[int, Sequence[frozenset]], weights: Mapping[Hashable, float] | None = None,
                        external: bool = True) -> dict[Hashable, dict[str, dict[str, np.ndarray]]]:
    """Per client, the cluster expert and the external expert of every adapter key.

    Args:
        states: ``{client: {peft key: array}}`` (the clients' trained LoRA factors).
        partitions: ``{layer: [frozenset of clients]}``; keys of layers absent here are not aggregated.
        weights: per-client weights (default 1; FedAvg uses the number of training examples).
        external: also form the external experts (the average over the other clusters).

    Returns:
        ``{client: {"clus": {key: array}, "ext": {key: array}}}``; "ext" leaves out layers whose cluster is
        every client.
    """
    keys = _check_states(states)
    ids = list(states)
    w = {cid: 1.0 for cid in ids} if weights is None else {cid: float(weights[cid]) for cid in ids}
    if any(not (math.isfinite(v) and v > 0) for v in w.values()):
        raise ValueError(f"weights must be positive and finite, got {w}")
    for layer, part in partitions.items():
        members = [c for block in part for c in block]
        if len(members) != len(ids) or set(members) != set(ids):
            raise ValueError(f"the partition of layer {layer} does not cover the clients {ids} exactly once")
    out: dict[Hashable, dict[str, dict[str, np.ndarray]]] = {cid: {"clus": {}, "ext": {}} for cid in ids}
    cache: dict[tuple[str, frozenset], np.ndarray] = {}

    def mean_over(key: str, group: frozenset) -> np.ndarray:
        if (key, group) not in cache:
            members = [c for c in ids if c in group]  # client order fixes the float summation order
            cache[key, group] = weighted_mean([states[c][key] for c in members], [w[c] for c in members])
        return cache[key, group]

    everyone = frozenset(ids)
    for key in keys:
        layer = _layer_of(key)
        if layer not in partitions:
            continue
        for block in partitions[layer]:
            rest = everyone - block
            for cid in block:
                # $$\bar A^{clus}_{l,k} = \sum_{j \in S_k} w_j A_{l,j} / \sum_{j \in S_k} w_j$$
                out[cid]["clus"][key] = mean_over(key, block)
                if external and rest:
                    # $$\bar A^{ext}_{l,k} = \sum_{j \notin S_k} w_j A_{l,j} / \sum_{j \notin S_k} w_j$$
                    out[cid]["ext"][key] = mean_over(key, rest)
    return out


# ----------------------------------------------------------------------------------------------- protocol
CLUS, EXT, UP = "clus/", "ext/", "lora/"
PERSONAL = "personal/"
"""the private state's prefix of the personal pass's adapters (``FederatedLoRA.personal_pass``; Ditto's v_k)"""


class FederatedLoRA(FederatedAlgorithm):
    """Rounds of local LoRA training under a server-side sharing rule, then one evaluation round.

    Round r = 1..``train_rounds``: every client loads the adapters the server sent (``clus/<key>``: the
    starting point of its trainable expert; ``ext/<key>``: a frozen external expert; keys not sent stay as the
    client left them, i.e. private), trains ``local_steps`` AdamW steps, and uploads the keys
    ``upload_keys(r)`` (``lora/<key>``) with its number of examples. The server turns the uploads into the next
    messages with ``sharing``. Round ``train_rounds + 1`` evaluates: each client returns the per-item
    correctness of its personalised model on its validation and test splits.

    Subclasses set ``sharing`` (and ``upload_keys``, ``train_A`` / ``train_B``, ``external``). A subclass may
    also give each client a second, private training pass per round (``personal_pass``: its inputs and kwargs;
    ``personal_outputs``: where its result is kept) and evaluate another model than the one it uploads
    (``eval_inputs``); both runners (``client_step``, so ``run_in_process`` and Flower, and ``run_batched``) run
    them. By default there is no second pass and the evaluation scores ``client_inputs``.

    Args:
        trainer: the client-side trainer (``client.LoRATrainer``): ``init_state()``, ``keys``, ``layers``,
            ``train(...)``, ``correct(...)``. Every client starts from ``trainer.init_state()`` (one seeded
            initialisation, so nothing is sent in round 1).
        train_rounds: communication rounds of training.
        local_steps: AdamW steps per client per round.
        lr: learning rate.
        seed: seed of the batch order (client c, round r draw with ``[seed, c, r]``).
    """

    message_type = "train"
    name = "federated_lora"
    train_A = True
    train_B = True
    external = False

    def __init__(self, trainer: Any, *, train_rounds: int, local_steps: int, lr: float, seed: int = 0,
                 gate_lr: float | None = None, gate_init: float = 0.5):
        for name, v in (("train_rounds", train_rounds), ("local_steps", local_steps)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {lr!r}")
        if gate_lr is not None and not (isinstance(gate_lr, (int, float)) and math.isfinite(gate_lr) and gate_lr > 0):
            raise ValueError(f"gate_lr must be a positive finite number or None, got {gate_lr!r}")
        self.gate_lr = None if gate_lr is None else float(gate_lr)
        if not (isinstance(gate_init, (int, float)) and 0.0 < gate_init < 1.0):
            raise ValueError(f"gate_init must be in (0, 1), got {gate_init!r}")
        self.gate_init = float(gate_init)
        self.trainer = trainer
        self.train_rounds, self.local_steps, self.lr, self.seed = train_rounds, local_steps, float(lr), int(seed)
        self.rounds = train_rounds + 1
        self.keys = list(trainer.keys)
        self.layers = sorted({_layer_of(k) for k in self.keys})
        self.modules = list(dict.fromkeys(module_of(k) for k in self.keys))

    # -- the sharing rule (subclasses) ---------------------------------------------------------------------
    def upload_keys(self, rnd: int) -> list[str]:
        """Which adapter keys clients upload after round ``rnd`` (default: all)."""
        return list(self.keys)

    def sharing(self, rnd: int, state: dict[str, Any], uploads: dict[int, dict[str, np.ndarray]]
                ) -> dict[int, Sequence[frozenset]]:
        """``{layer: partition}`` for the next round: each client gets its block's average (absent: private)."""
        raise NotImplementedError

    def shared_factors(self) -> tuple[str, ...]:
        """Which factors the partitions apply to (``("A", "B")``; FedSA-LoRA: ``("A",)``)."""
        return ("A", "B")

    # -- server ---------------------------------------------------------------------------------------------
    def initial_state(self, client_ids: Sequence[int]) -> dict[str, Any]:
        return {"messages": {cid: {} for cid in client_ids}, "bytes_down": [], "bytes_up": [], "log": {}}

    def configure(self, rnd: int, state: dict[str, Any], client_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        phase = "eval" if rnd > self.train_rounds else "train"
        messages = {cid: {**state["messages"].get(cid, {}), "phase": phase} for cid in client_ids}
        if phase == "train":
            state["bytes_down"].append(int(sum(_nbytes(m) for m in messages.values())))
        return messages

    def aggregate(self, rnd: int, state: dict[str, Any], replies: dict[int, dict[str, Any]]) -> dict[str, Any]:
        if rnd > self.train_rounds:
            state["val"] = {cid: np.asarray(r["val_correct"]) for cid, r in sorted(replies.items())}
            state["test"] = {cid: np.asarray(r["test_correct"]) for cid, r in sorted(replies.items())}
            state["mix"] = {cid: float(r["mean_mix"]) for cid, r in sorted(replies.items())}
            return state
        state["bytes_up"].append(int(sum(_nbytes(r) for r in replies.values())))
        ids = sorted(replies)
        uploads = {cid: {k[len(UP):]: v for k, v in replies[cid].items() if k.startswith(UP)} for cid in ids}
        weights = {cid: float(replies[cid]["num_examples"]) for cid in ids}
        if any(w <= 0 for w in weights.values()):
            empty = [cid for cid in ids if weights[cid] <= 0]
            raise ValueError(f"clients {empty} have no training data")
        partitions = self.sharing(rnd, state, uploads)
        factors = self.shared_factors()
        messages: dict[int, dict[str, Any]] = {cid: {} for cid in ids}
        if partitions:
            keys = [k for k in self.keys if _layer_of(k) in partitions and factor_of(k) in factors]
            sub = {cid: {k: uploads[cid][k] for k in keys} for cid in ids}
            missing = [k for k in keys if any(k not in uploads[cid] for cid in ids)]
            if missing:
                raise RuntimeError(f"round {rnd}: the sharing rule needs {missing[:2]} but clients did not upload them")
            experts = aggregate_tree_lora(sub, partitions, weights, external=self.external)
            for cid in ids:
                messages[cid].update({CLUS + k: v for k, v in experts[cid]["clus"].items()})
                messages[cid].update({EXT + k: v for k, v in experts[cid]["ext"].items()})
        state["messages"] = messages
        return state

    def result(self, state: dict[str, Any]) -> dict[str, Any]:
        return state

    # -- client ---------------------------------------------------------------------------------------------
    def client_inputs(self, message: Mapping[str, Any], state: Mapping[str, Any]
                      ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, float]]:
        """A client's starting point: (cluster experts, external experts, gate logits) from the server's message
        and its private state (keys the server did not send stay as the client left them)."""
        own = {k: state.get("own/" + k) for k in self.keys}
        if any(v is None for v in own.values()):
            own = self.trainer.init_state()
        clus = {k: np.asarray(message.get(CLUS + k, own[k])) for k in self.keys}
        ext = {k: np.asarray(message[EXT + k]) for k in self.keys if EXT + k in message}
        # $$\lambda_{l,k} = \sigma(\ell_{l,k})$$, the logit starting at logit(gate_init) and kept by the client
        start = math.log(self.gate_init / (1.0 - self.gate_init))
        mix = {m: float(state.get("mix/" + m, start)) for m in self.modules}
        return clus, ext, mix

    def client_outputs(self, data: Any, rnd: int, trained: Mapping[str, np.ndarray], mix: Mapping[str, float]
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(reply, new private state) after local training: the uploaded keys and the number of examples."""
        new_state = {**{"own/" + k: v for k, v in trained.items()}, **{"mix/" + k: v for k, v in mix.items()}}
        reply: dict[str, Any] = {UP + k: trained[k] for k in self.upload_keys(rnd)}
        reply["num_examples"] = int(data.n_train)
        return reply, new_state

    def personal_pass(self, data: Any, rnd: int, message: Mapping[str, Any], state: Mapping[str, Any]
                      ) -> tuple[tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, float]],
                                 dict[str, Any]] | None:
        """A second local training pass of round ``rnd`` whose result stays on the client, or None (the default).

        Runs after the uploaded pass, from the same ``message`` and the client's private ``state`` as it was before
        this round; its result goes through ``personal_outputs`` into the new private state (never into the reply).

        Args:
            data: the client's data.
            rnd: the round (1-based).
            message: the server's message of this round.
            state: the client's private state before this round.

        Returns:
            None, or ``((clus, ext, mix_logits), kwargs)``: the trainer's inputs and ``train`` kwargs of the pass.
        """
        return None

    def personal_outputs(self, rnd: int, trained: Mapping[str, np.ndarray], mix: Mapping[str, float],
                         state: Mapping[str, Any]) -> dict[str, Any]:
        """The private state after a personal pass: ``state`` (after ``client_outputs``) plus the pass's adapters
        under ``personal/<key>`` (its gate logits are not kept).

        Args:
            rnd: the round.
            trained: the personal pass's adapters (peft keys).
            mix: its gate logits.
            state: the new private state from ``client_outputs``.
        """
        return {**state, **{PERSONAL + k: v for k, v in trained.items()}}

    def eval_inputs(self, message: Mapping[str, Any], state: Mapping[str, Any]
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, float]]:
        """The ``(clus, ext, mix_logits)`` the evaluation round scores (default: ``client_inputs``)."""
        return self.client_inputs(message, state)

    def train_kwargs(self, data: Any, rnd: int) -> dict[str, Any]:
        """The local training settings of ``data``'s client in round ``rnd`` (batch seed ``[seed, cid, rnd]``)."""
        return dict(steps=self.local_steps, lr=self.lr, seed=(self.seed, int(data.cid), rnd), train_A=self.train_A,
                    train_B=self.train_B, gate_lr=self.gate_lr)

    def client_step(self, data: Any, message: dict[str, Any], state: dict[str, Any], rnd: int
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if message.get("phase") == "eval":
            clus, ext, mix = self.eval_inputs(message, state)
            return eval_reply(self.trainer.correct(data.val, clus, ext, mix),
                              self.trainer.correct(data.test, clus, ext, mix), mix, ext), state
        clus, ext, mix = self.client_inputs(message, state)
        if data.n_train == 0:
            raise ValueError(f"client {data.cid} has no training data")
        trained, mix = self.trainer.train(data.train, clus, ext, mix, **self.train_kwargs(data, rnd))
        reply, new_state = self.client_outputs(data, rnd, trained, mix)
        personal = self.personal_pass(data, rnd, message, state)
        if personal is not None:
            inputs, kwargs = personal
            trained, mix = self.trainer.train(data.train, *inputs, **kwargs)
            new_state = self.personal_outputs(rnd, trained, mix, new_state)
        return reply, new_state


def eval_reply(val: np.ndarray, test: np.ndarray, mix: Mapping[str, float], ext: Mapping[str, np.ndarray]
               ) -> dict[str, Any]:
    """The evaluation round's reply: per-item correctness on validation and test, and the mean gate."""
    gates = _gates_in_use(mix, ext)
    return {"val_correct": np.asarray(val, dtype=np.float64), "test_correct": np.asarray(test, dtype=np.float64),
            "mean_mix": float(np.mean(gates)) if gates else 1.0}


def run_batched(algorithm: FederatedLoRA, client_data: Sequence[Any], trainer: Any) -> Any:
    """``common.federation.run_in_process`` with every client's local training in one batched forward pass.

    The same protocol (``configure`` -> client inputs -> local training -> ``aggregate``, clients in index order,
    the same batch draws); ``trainer`` is a ``client.BatchedLoRATrainer`` over the same base, whose per-client
    adapters, gates and AdamW states are independent slices of stacked tensors, so each client's update is its
    own (tests check the result against ``run_in_process`` up to float summation order). About three times
    faster on a CPU for 8 clients of a tiny model. A ``personal_pass`` (Ditto) is a second ``train_many`` over every
    client after the uploaded pass; the evaluation round scores ``eval_inputs``.
    """
    from ..common.federation import check_payload

    if len(client_data) == 0:
        raise ValueError("client_data must hold at least one client")
    ids = list(range(len(client_data)))
    state = algorithm.initial_state(ids)
    client_states: dict[int, dict[str, Any]] = {cid: {} for cid in ids}
    for rnd in range(1, algorithm.rounds + 1):
        messages = algorithm.configure(rnd, state, ids)
        messages = {cid: check_payload(messages[cid], f"round {rnd} message to client {cid}") for cid in ids}
        replies: dict[int, dict[str, Any]] = {}
        if messages[ids[0]].get("phase") == "eval":
            inputs = {cid: algorithm.eval_inputs(messages[cid], client_states[cid]) for cid in ids}
            for split in ("val", "test"):
                outs = trainer.correct_many([getattr(client_data[c], split) for c in ids],
                                            [inputs[c] for c in ids])
                for cid, out in zip(ids, outs, strict=True):
                    replies.setdefault(cid, {})[split] = out
            replies = {cid: eval_reply(r["val"], r["test"], inputs[cid][2], inputs[cid][1])
                       for cid, r in replies.items()}
        else:
            inputs = {cid: algorithm.client_inputs(messages[cid], client_states[cid]) for cid in ids}
            empty = [cid for cid in ids if client_data[cid].n_train == 0]
            if empty:
                raise ValueError(f"clients {empty} have no training data")
            # the personal passes start from the private states before this round, as in ``client_step``
            personal = [algorithm.personal_pass(client_data[c], rnd, messages[c], client_states[c]) for c in ids]
            kwargs = [algorithm.train_kwargs(client_data[c], rnd) for c in ids]
            trained = trainer.train_many([client_data[c].train for c in ids], [inputs[c] for c in ids], kwargs)
            for cid, (weights, mix) in zip(ids, trained, strict=True):
                reply, client_states[cid] = algorithm.client_outputs(client_data[cid], rnd, weights, mix)
                replies[cid] = check_payload(reply, f"round {rnd} reply of client {cid}")
            if any(p is not None for p in personal):
                lacking = [cid for cid, p in zip(ids, personal, strict=True) if p is None]
                if lacking:
                    raise ValueError(f"round {rnd}: a batched personal pass needs every client, clients {lacking} "
                                     "have none")
                outs = trainer.train_many([client_data[c].train for c in ids], [p[0] for p in personal],
                                          [p[1] for p in personal])
                for cid, (weights, mix) in zip(ids, outs, strict=True):
                    client_states[cid] = algorithm.personal_outputs(rnd, weights, mix, client_states[cid])
        state = algorithm.aggregate(rnd, state, replies)
    return algorithm.result(state)


def _gates_in_use(mix: Mapping[str, float], ext: Mapping[str, np.ndarray]) -> list[float]:
    """lambda of every module that has an external expert."""
    modules = {module_of(k) for k in ext}
    return [1.0 / (1.0 + math.exp(-mix[m])) for m in sorted(modules)]


def _nbytes(payload: Mapping[str, Any]) -> int:
    return sum(int(np.asarray(v).nbytes) for v in payload.values() if isinstance(v, (np.ndarray, np.generic)))


class FedTreeLoRA(FederatedLoRA):
    """FedTreeLoRA: local warm-up, one client tree, monotone per-layer cuts, cluster + external experts.

    Args:
        trainer, train_rounds, local_steps, lr, seed: see ``FederatedLoRA``.
        warmup_rounds: E_warm, rounds of local-only training before the tree (>= 1, < train_rounds).
        tau: the score of "no split" (see ``select_layer_cuts``).
        window: K, the search window of the cut counts.
        distance, linkage: of the client tree.
        cut_rule: ``"tree"`` (the method), ``"fixed"`` (ablation: ``fixed_k`` clusters in every layer) or
            ``"independent"`` (ablation: each layer clustered alone, no shared tree).
        fixed_k: the cluster count of ``cut_rule="fixed"``.
        external: mix in the external expert with a learnable gate (``False``: the ablation "no mixing", a
            cluster-only model).

    The tree and cuts are built once, from the B matrices uploaded after the last warm-up round; they are in
    the state's ``log`` (``cuts``, ``linkage``, ``partitions``, ``layer_distances``).
    """

    name = "fedtreelora"

    def __init__(self, trainer: Any, *, train_rounds: int, local_steps: int, lr: float, seed: int = 0,
                 gate_lr: float | None = 0.05, gate_init: float = 0.9, warmup_rounds: int = 2, tau: float = 0.2,
                 window: int = 3,
                 distance: str = "cosine", linkage: str = "average", cut_rule: str = "tree",
                 fixed_k: int | None = None, external: bool = True):
        super().__init__(trainer, train_rounds=train_rounds, local_steps=local_steps, lr=lr, seed=seed,
                         gate_lr=gate_lr, gate_init=gate_init)
        if isinstance(warmup_rounds, bool) or not isinstance(warmup_rounds, int) or not 1 <= warmup_rounds < train_rounds:
            raise ValueError(f"warmup_rounds must be an int in [1, train_rounds), got {warmup_rounds!r}")
        if cut_rule not in CUT_RULES:
            raise ValueError(f"cut_rule must be one of {CUT_RULES}, got {cut_rule!r}")
        if cut_rule == "fixed" and (isinstance(fixed_k, bool) or not isinstance(fixed_k, int) or fixed_k < 1):
            raise ValueError(f"cut_rule='fixed' needs fixed_k, a positive int; got {fixed_k!r}")
        if distance not in DISTANCES:
            raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
        if linkage not in LINKAGES:
            raise ValueError(f"linkage must be one of {LINKAGES}, got {linkage!r}")
        _check_tau_window(tau, window)
        self.warmup_rounds, self.tau, self.window = warmup_rounds, float(tau), int(window)
        self.distance, self.linkage, self.cut_rule, self.fixed_k = distance, linkage, cut_rule, fixed_k
        self.external = bool(external)

    def upload_keys(self, rnd: int) -> list[str]:
        return [] if rnd < self.warmup_rounds else list(self.keys)

    def sharing(self, rnd: int, state: dict[str, Any], uploads: dict[int, dict[str, np.ndarray]]
                ) -> dict[int, Sequence[frozenset]]:
        if rnd < self.warmup_rounds:
            return {}
        if rnd == self.warmup_rounds:
            state["log"] = self.build(uploads)
        return dict(zip(self.layers, state["log"]["partitions"], strict=True))

    def build(self, uploads: Mapping[int, Mapping[str, np.ndarray]]) -> dict[str, Any]:
        """Tree, cuts and per-layer partitions from the clients' uploaded adapters (their B matrices)."""
        ids = sorted(uploads)
        if self.cut_rule == "fixed" and self.fixed_k > len(ids):
            raise ValueError(f"fixed_k={self.fixed_k} clusters but only {len(ids)} clients")
        B = {cid: [[uploads[cid][k] for k in self.keys if k.endswith("lora_B.weight") and _layer_of(k) == layer]
                   for layer in self.layers] for cid in ids}
        tree = build_client_tree(B, self.distance, self.linkage)
        if self.cut_rule == "tree":
            cuts = select_layer_cuts(tree, self.tau, self.window)
            partitions = tree_partitions(tree, cuts)
        elif self.cut_rule == "fixed":
            cuts = [self.fixed_k] * len(self.layers)
            partitions = tree_partitions(tree, cuts)
        else:
            cuts, partitions = independent_partitions(tree.layer_distances, tree.ids, self.tau, self.linkage)
        return {"cuts": cuts, "linkage": tree.linkage, "partitions": partitions, "ids": ids,
                "layer_distances": tree.layer_distances, "tree": tree, "B": B}
