r"""The embedded default: shared structure and a planted hierarchy of counting rules over a pretrained tiny Llama.

**Inputs.** Strings of ``length`` letters from ``letters`` (default ``a``-``h``) followed by a query,
``"cabhadeg:a="``, written with the lab's character tokenizer (``icml26.common.tiny_lm.char_tokenizer``). Every
prompt has the same length, so batches need no padding.

**The base (public, central).** A tiny Llama pretrained on *count queries*: ``"cabhadeg:a="`` -> ``"2"`` (how often
the query letter occurs; counts 0-3 equally often). It learns to find a letter and count it and to write the
count as a digit; it never sees a client's rule. ``pretrain_corpus`` generates its data.

**Clients (private, federated).** Client k sees the same kind of prompt (query letter uniform over the alphabet)
and answers ``"1"`` or ``"0"``: is the count of the query letter in its rule's positive set, **flipped when the
query letter is one of the shared ``twist`` letters** (default: the first half of the alphabet, ``a``-``d``)? A
rule is written as its labels
for the counts 0, 1, 2, 3. The twist is what every client shares and the base does not know (issue #50 item 3:
a world where a global model is not capped at zero-shot); the rules are what clients do not share. The planted
tree:

=========  ======  ===========================  ================================================
level      blocks  differs by                   default rules (labels of counts 0 1 2 3)
=========  ======  ===========================  ================================================
root       1       nothing                      the twist (labels flipped for query letters a-d)
top        2       the shape of the rule        group 0 "at least t", group 1 "exactly in a band"
subgroup   4       its parameter                ``0011`` (>= 2), ``0001`` (>= 3), ``0100`` (= 1), ``0110`` (1-2)
leaf       8       data only                    two clients per rule, disjoint samples
=========  ======  ===========================  ================================================

Siblings share the rule; cousins disagree on one count value; rules of different groups disagree on two or
three, so one global rule cannot serve everyone (FedAvg's conflict). Every client needs the same low-level skill
(finding and counting the query letter, which the base has) and the same twist (which only federation or local
data can teach), and differs in the decision read from the count: the functional structure of the paper's
"shared trunk, specialised branches". No rule is the complement of another (complements would flip every
layer's update and hide the depth structure). Each client draws its counts so that its labels are balanced
(half of the mass uniform over the rule's positive counts, half over the negative ones), a mild statistical
heterogeneity on top of the rules.

**Ceilings** (exact, from the sampling law; ``World.ceilings``): a client that knows its rule and the twist is
always right (1.0); the best single global predictor ("count >= 1", flipped on the twist letters) scores 0.708
on average over the default clients; the frozen base's own answer ("count >= 1", never flipped) scores 0.708 on
the untwisted half of the queries and 0.292 on the twisted half, 0.5 in all. So a global model has 20.8 points to
learn over zero-shot and personalisation 29.2 more. (With a quarter of the letters twisted, v2's first world,
FedAvg gained 3.4 of its 10.4 points: averaging conflicting rules cost it on the untwisted queries what it won on
the twisted ones; README, Deviation 9.)

**Unseen clients.** ``unseen_per_rule`` more clients per rule (``World.unseen``, ids after the training
clients') never take part in training; the generalisation claim personalises them from the trained federation.

Example:
    >>> import numpy as np
    >>> world = World()
    >>> [c.rule for c in world.clients][::2]
    ['0011', '0001', '0100', '0110']
    >>> world.planted_labels("top").tolist(), world.planted_labels("subgroup").tolist()
    ([0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3])
    >>> s, y = world.sample(world.clients[2], np.random.default_rng(0), 3)
    >>> [(t, int(v)) for t, v in zip(s, y)]            # c is a twist letter: its label is flipped
    [('daaacgfh:c', 1), ('ddhbgefc:f', 0), ('fgbghadg:g', 1)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: count values a prompt can have (the base is pretrained on the same range)
COUNTS = (0, 1, 2, 3)


def rule_set(rule: str) -> frozenset[int]:
    """The positive counts of a rule written as its labels of the counts 0..3 (``"0011"``: count >= 2)."""
    if not isinstance(rule, str) or len(rule) != len(COUNTS) or set(rule) - {"0", "1"}:
        raise ValueError(f"a rule is {len(COUNTS)} characters of 0/1 (labels of the counts {COUNTS}), got {rule!r}")
    pos = frozenset(c for c, ch in zip(COUNTS, rule, strict=True) if ch == "1")
    if not pos or pos == frozenset(COUNTS):
        raise ValueError(f"rule {rule!r} labels every count the same")
    return pos


@dataclass(frozen=True)
class ClientSpec:
    """One client's planted rule and its place in the tree."""

    cid: int
    rule: str
    """labels of the counts 0..3 of the query letter (``"0011"``: 1 iff count >= 2)"""
    group: int
    """top-level group"""
    subgroup: int
    """subgroup (the exact rule)"""

    @property
    def positive(self) -> frozenset[int]:
        return rule_set(self.rule)


@dataclass
class World:
    """The planted hierarchy: one tuple of rules per top-level group, ``per_rule`` clients per rule.

    Args:
        groups: rules of each group (default: "at least 2 / 3" vs "exactly 1 / 1-2").
        per_rule: clients sharing each exact rule.
        letters: the alphabet of the strings.
        length: string length (before the ``:q`` query).
        twist: query letters whose label every client flips (shared by all; ``""``: no twist; default: the first
            half of ``letters``).
        unseen_per_rule: clients per rule held out of training (``unseen``), numbered after ``clients``.
    """

    groups: tuple[tuple[str, ...], ...] = (("0011", "0001"), ("0100", "0110"))
    per_rule: int = 2
    letters: str = "abcdefgh"
    length: int = 8
    twist: str | None = None
    unseen_per_rule: int = 1
    clients: list[ClientSpec] = field(init=False)
    unseen: list[ClientSpec] = field(init=False)

    def __post_init__(self) -> None:
        if len(set(self.letters)) != len(self.letters) or len(self.letters) < 3:
            raise ValueError(f"letters must be at least 3 distinct characters, got {self.letters!r}")
        if self.per_rule < 1 or self.length < max(COUNTS) + 1:
            raise ValueError(f"need per_rule >= 1 and length >= {max(COUNTS) + 1}, got {self.per_rule}, {self.length}")
        if self.twist is None:
            self.twist = self.letters[:len(self.letters) // 2]
        if not isinstance(self.twist, str) or set(self.twist) - set(self.letters) or len(set(self.twist)) != len(
                self.twist) or len(self.twist) >= len(self.letters):
            raise ValueError(f"twist must be distinct letters of {self.letters!r}, not all of them, got {self.twist!r}")
        if isinstance(self.unseen_per_rule, bool) or not isinstance(self.unseen_per_rule, int) or self.unseen_per_rule < 0:
            raise ValueError(f"unseen_per_rule must be a non-negative int, got {self.unseen_per_rule!r}")
        rules = [r for g in self.groups for r in g]
        if not rules or len(set(rules)) != len(rules):
            raise ValueError(f"groups must hold distinct rules, got {self.groups}")
        self.clients, self.unseen = [], []
        for which, count in ((self.clients, self.per_rule), (self.unseen, self.unseen_per_rule)):
            sub = 0
            for g, rules_g in enumerate(self.groups):
                for rule in rules_g:
                    rule_set(rule)
                    for _ in range(count):
                        which.append(ClientSpec(len(self.clients) + len(self.unseen), rule, g, sub))
                    sub += 1

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    def planted_labels(self, level: str, clients: list[ClientSpec] | None = None) -> np.ndarray:
        """Cluster labels of the planted tree at ``level`` (``"top"``, ``"subgroup"`` or ``"leaf"``) of the
        training clients (or of ``clients``, e.g. ``unseen``)."""
        specs = self.clients if clients is None else clients
        if level == "top":
            return np.array([c.group for c in specs])
        if level == "subgroup":
            return np.array([c.subgroup for c in specs])
        if level == "leaf":
            return np.arange(len(specs))
        raise ValueError(f"level must be 'top', 'subgroup' or 'leaf', got {level!r}")

    def label(self, client: ClientSpec, count: int, q: str) -> int:
        r"""The client's label of a prompt whose query letter ``q`` occurs ``count`` times.

        $$y = [\mathrm{count} \in P_k] \oplus [q \in \mathrm{twist}]$$
        """
        return int(count in client.positive) ^ int(q in self.twist)

    def ceilings(self) -> dict[str, float]:
        """Exact mean accuracies over the training clients under the sampling law: ``oracle`` (each client's own
        rule and the twist), ``global`` (the best single predictor of (count, twisted?)), ``zero_shot`` (the
        base's "count >= 1", never flipped)."""
        f = len(self.twist) / len(self.letters)

        def acc(client: ClientSpec, pred) -> float:
            # P(count | y) uniform over the rule's positive (y_rule = 1) or negative counts, y_rule balanced
            pos, neg = sorted(client.positive), sorted(set(COUNTS) - client.positive)
            total = 0.0
            for t, pt in ((False, 1.0 - f), (True, f)):
                for y_rule, counts in ((1, pos), (0, neg)):
                    for c in counts:
                        total += pt * 0.5 / len(counts) * (pred(c, t) == (y_rule ^ int(t)))
            return total

        masses: dict[tuple[int, bool, int], float] = {}
        for client in self.clients:
            pos, neg = client.positive, set(COUNTS) - client.positive
            for c in COUNTS:
                for t in (False, True):
                    y = int(c in pos) ^ int(t)
                    p = 0.5 / (len(pos) if c in pos else len(neg))
                    masses[(c, t, y)] = masses.get((c, t, y), 0.0) + p
        best = {(c, t): int(masses.get((c, t, 1), 0.0) > masses.get((c, t, 0), 0.0)) for c in COUNTS for t in (False, True)}
        n = len(self.clients)
        return {"oracle": 1.0,
                "global": sum(acc(k, lambda c, t: best[(c, t)]) for k in self.clients) / n,
                "zero_shot": sum(acc(k, lambda c, t: int(c >= 1)) for k in self.clients) / n}

    def sample(self, client: ClientSpec, rng: np.random.Generator, n: int) -> tuple[list[str], np.ndarray]:
        """``n`` prompts (without the final ``=``) of ``client``'s distribution and their 0/1 labels."""
        pos = sorted(client.positive)
        neg = sorted(set(COUNTS) - client.positive)
        strings, labels = [], np.zeros(n, dtype=np.int64)
        for i in range(n):
            y_rule = int(rng.random() < 0.5)
            count = int(rng.choice(pos if y_rule else neg))
            q = str(rng.choice(list(self.letters)))
            chars = list(rng.choice([c for c in self.letters if c != q], size=self.length))
            for p in rng.choice(self.length, size=count, replace=False):
                chars[p] = q
            strings.append("".join(chars) + ":" + q)
            labels[i] = self.label(client, count, q)
        return strings, labels


def pretrain_corpus(letters: str, length: int, rng: np.random.Generator, n: int) -> tuple[list[str], list[str]]:
    """The base's public objective: ``"<string>:<q>="`` -> the count of q in the string (one digit).

    The query letter is uniform over ``letters`` and planted 0-3 times (uniformly); the other positions are
    uniform over the remaining letters.
    """
    prompts, answers = [], []
    for _ in range(n):
        q = str(rng.choice(list(letters)))
        count = int(rng.integers(0, 4))
        chars = list(rng.choice([c for c in letters if c != q], size=length))
        for pos in rng.choice(length, size=count, replace=False):
            chars[pos] = q
        prompts.append("".join(chars) + f":{q}=")
        answers.append(str(count))
    return prompts, answers


@dataclass
class ClientData:
    """One client's tokenised splits (fixed-length prompts, 0/1 labels) and its planted rule.

    ``train`` / ``val`` / ``test``: ``(input_ids int64 array (n, T), labels int64 array (n,))``; ``texts``: the
    prompts of each split (``{"train": [...], ...}``, in the same order; empty where the data came without them).
    """

    spec: ClientSpec
    train: tuple[np.ndarray, np.ndarray]
    val: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]
    texts: dict[str, list[str]] = field(default_factory=dict)

    def item_ids(self, split: str) -> list[str]:
        """What each item of ``split`` is: ``c<client>/<prompt>`` (the label follows from the client's rule), the
        same id in every split and seed where the client meets the same prompt."""
        return [f"c{self.cid}/{t}" for t in self.texts[split]]

    @property
    def cid(self) -> int:
        return self.spec.cid

    @property
    def n_train(self) -> int:
        return len(self.train[1])


def encode(tokenizer: Any, strings: list[str]) -> np.ndarray:
    """Token ids of the prompts ``s + "="`` (all the same length) as an int64 array."""
    ids = [tokenizer(s + "=", add_special_tokens=False)["input_ids"] for s in strings]
    if len({len(r) for r in ids}) > 1:
        raise ValueError("prompts must all have the same length")
    return np.asarray(ids, dtype=np.int64)


#: draws of one validation or test item before ``make_clients`` gives up finding a prompt outside the earlier splits
MAX_REDRAWS = 1000


def make_clients(world: World, tokenizer: Any, *, n_train: int, n_val: int, n_test: int, seed: int,
                 specs: list[ClientSpec] | None = None) -> list[ClientData]:
    """Every client's train / validation / test splits, drawn with ``seed`` (disjoint draws per client).

    ``specs``: which clients (default ``world.clients``; ``world.unseen`` for the held-out clients, whose draws
    are seeded by their own ids, so they are independent of the training clients').

    The splits are disjoint as sets of prompts: a validation or test prompt that an earlier split of the client
    already holds is drawn again (the prompt space is large, so this is rare: none in seeds 0-2 and 100-104, whose
    draws it leaves unchanged), so no test item is one the client trained or tuned on.
    """
    if min(n_train, n_val, n_test) < 1:
        raise ValueError(f"every split needs at least one example, got {n_train}, {n_val}, {n_test}")
    out = []
    for spec in world.clients if specs is None else specs:
        rng = np.random.default_rng([seed, spec.cid, 17])
        splits, texts = [], {}
        seen: set[str] = set()
        for name, n in (("train", n_train), ("val", n_val), ("test", n_test)):
            s, y = world.sample(spec, rng, n)
            for i in range(n):
                for _ in range(MAX_REDRAWS):
                    if s[i] not in seen:
                        break
                    (s[i],), (y[i],) = world.sample(spec, rng, 1)  # an earlier split's prompt: draw it again
                else:
                    raise ValueError(f"client {spec.cid}: no {name} prompt outside the earlier splits in "
                                     f"{MAX_REDRAWS} draws; the world has too few distinct prompts for these splits")
            seen.update(s)
            splits.append((encode(tokenizer, s), y))
            texts[name] = s
        out.append(ClientData(spec, *splits, texts=texts))
    return out
