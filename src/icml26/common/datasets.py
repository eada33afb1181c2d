"""Embedded datasets: bundled with scikit-learn or generated from a seed; nothing is downloaded.

Example:
    >>> d = digits(seed=0)
    >>> d.X_train.shape[1], d.n_classes, round(float(d.X_train.mean()), 6)
    (64, 10, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Split:
    """A train/test split of a classification dataset (features float32, labels int64)."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int


def digits(seed: int = 0, test_size: float = 0.2, standardize: bool = True) -> Split:
    """sklearn's bundled 8x8 digits (1797 images, 10 classes), split with a seeded stratified shuffle.

    Args:
        seed: seed of the split.
        test_size: fraction held out, in (0, 1).
        standardize: scale pixels to zero mean and unit variance using train statistics only.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_size < 1.0:
        raise ValueError(f"test_size must be in (0, 1), got {test_size}")
    data = load_digits()
    X = data.data.astype(np.float64)
    y = data.target.astype(np.int64)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=test_size, random_state=seed, stratify=y)
    if standardize:
        mean, std = X_tr.mean(0), X_tr.std(0)
        std[std == 0] = 1.0
        X_tr, X_te = (X_tr - mean) / std, (X_te - mean) / std
    return Split(X_tr.astype(np.float32), y_tr, X_te.astype(np.float32), y_te, 10)


@dataclass(frozen=True)
class TextCorpus:
    """Sentences with integer labels and the label names."""

    sentences: list[str]
    labels: np.ndarray
    label_names: list[str]


def docstring_corpus() -> TextCorpus:
    """2,498 first sentences of Python 3.11 standard-library docstrings, labelled by module family (9 labels).

    Shipped as ``common/data/docstrings.tsv`` (regenerate with ``scripts/make_docstring_corpus.py``): a bundled
    text set for text-model experiments, independent of the running Python.

    Example:
        >>> c = docstring_corpus()
        >>> len(c.sentences), len(c.label_names)
        (2498, 9)
    """
    from importlib.resources import files

    text = files("icml26.common").joinpath("data", "docstrings.tsv").read_text(encoding="utf-8")
    rows = [line.split("\t", 1) for line in text.splitlines() if line]
    names = sorted({label for label, _ in rows})
    index = {n: i for i, n in enumerate(names)}
    return TextCorpus([s for _, s in rows], np.array([index[label] for label, _ in rows], dtype=np.int64), names)
