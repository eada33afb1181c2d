"""The embedded images: contrast-normalised grey 16 x 16 patches of scikit-learn's two bundled photographs.

``load_sample_images()`` ships ``china.jpg`` and ``flower.jpg`` (427 x 640 RGB) inside scikit-learn, so nothing is
downloaded. Natural-image patches have a broad, power-law spectrum, unlike 8 x 8 digits: a 16-position code
of a patch has room for many independent directions, the setting where a collapsed codebook could limit
reconstruction. Train patches come from the left part of each photograph, test patches from the right part,
with a gap of one patch width between them, so no test pixel was seen in training. Each patch is
contrast-normalised, (x - mean(x)) / (std(x) + 0.05) over its own pixels (the usual preprocessing of
natural-image patch models; the 0.05 keeps flat patches near zero instead of amplifying their noise): without
it the brightness direction dominates and SimVQ used a few percent of its codes in a pilot run.

Example:
    >>> X_tr, X_te = patches(seed=0, n_train=100, n_test=20)
    >>> X_tr.shape, X_te.shape, bool(abs(X_tr.mean(axis=(1, 2, 3))).max() < 1e-5)
    ((100, 1, 16, 16), (20, 1, 16, 16), True)
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

#: columns of each photograph (640 wide) that train patches may cover; test patches start one patch later
TRAIN_COLUMNS = 448
#: added to each patch's standard deviation in the contrast normalisation
CONTRAST_EPS = 0.05


@lru_cache(maxsize=1)
def _grey_images() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_sample_images

    return tuple(img.astype(np.float32).mean(axis=2) / 255.0 for img in load_sample_images().images)


def positions(seed: int = 0, n_train: int = 8000, n_test: int = 500, size: int = 16
              ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """``(train, test)`` positions ``(photograph, top, left)`` of the patches ``patches`` cuts, in its order."""
    for name, value in (("n_train", n_train), ("n_test", n_test), ("size", size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    rng = np.random.default_rng(seed)
    out: list[list[tuple[int, int, int]]] = []
    for n, (lo, hi) in ((n_train, (0, TRAIN_COLUMNS - size)), (n_test, (TRAIN_COLUMNS + size, None))):
        where = []
        for k, img in enumerate(_grey_images()):
            count = n // 2 + (n % 2 if k == 0 else 0)
            top = rng.integers(0, img.shape[0] - size + 1, count)
            left = rng.integers(lo, (hi if hi is not None else img.shape[1] - size) + 1, count)
            where += [(k, int(t), int(c)) for t, c in zip(top, left, strict=True)]
        out.append(where)
    return out[0], out[1]


def patch_ids(seed: int = 0, n_train: int = 8000, n_test: int = 500, size: int = 16
              ) -> tuple[list[str], list[str]]:
    """``(train, test)`` ids of the patches ``patches`` cuts: the photograph, the position and the size in that
    fixed pool (``"1@120,500/16"``), so the same patch has the same id in every seed and a test patch can never
    share an id with a train patch (train and test columns are disjoint)."""
    train, test = positions(seed, n_train, n_test, size)
    return [f"{k}@{t},{c}/{size}" for k, t, c in train], [f"{k}@{t},{c}/{size}" for k, t, c in test]


def patches(
    seed: int = 0, n_train: int = 8000, n_test: int = 500, size: int = 16, normalize: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` patches, shape (n, 1, size, size), drawn with ``seed``.

    Args:
        seed: seed of the patch positions.
        n_train: train patches (half from each photograph).
        n_test: test patches (half from each photograph).
        size: patch side in pixels.
        normalize: contrast-normalise each patch (else grey levels in [0, 1]).
    """
    images = _grey_images()
    out = []
    for where in positions(seed, n_train, n_test, size):
        x = np.stack([images[k][t : t + size, c : c + size] for k, t, c in where])[:, None].astype(np.float64)
        if normalize:
            mean = x.mean(axis=(1, 2, 3), keepdims=True)
            std = x.std(axis=(1, 2, 3), keepdims=True)
            # $$\tilde x = (x - \bar x) / (\mathrm{sd}(x) + \epsilon)$$
            x = (x - mean) / (std + CONTRAST_EPS)
        out.append(x.astype(np.float32))
    return out[0], out[1]
