"""Deterministic datasets for the accuracy experiments, and sharding of batches by rank.

Two datasets:

- ``synthetic`` (default, no extra dependency): a teacher-student classification task. A
  fixed random two-layer *teacher* network labels Gaussian inputs; the student learns the
  labels. Every rank generates the same data from the seed, so no file is shipped.
- ``digits``: the 8x8 handwritten digits that scikit-learn ships (1,797 images, offline).
  Needs the optional extra: ``pip install 'ddpbench[digits]'``.

:class:`ShardedLoader` cuts every *global* batch of ``batch_size x num_workers`` samples into
contiguous per-rank shards, from a permutation that is the same on every rank, so the union
of the shards of one step is exactly the batch a single process would see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DATASETS", "Dataset", "ShardedLoader", "digits", "load_dataset", "teacher_student"]


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


DATASETS: dict[str, Callable[..., Dataset]] = {"synthetic": teacher_student, "digits": digits}


def load_dataset(name: str, *, seed: int = 0) -> Dataset:
    """Return dataset ``name`` (``synthetic`` or ``digits``).

    Raises:
        ValueError: unknown name (the valid ones are listed).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid datasets: {sorted(DATASETS)}")
    return DATASETS[name](seed=seed)


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
