"""Reduced-precision ring allreduce numerics: an exact emulator and predivide-factor maps.

Users pick ``gradient_predivide_factor`` f to keep half-precision gradient sums in range:
every rank multiplies its gradient by 1/f before the ring (prescale), the ring sums in the
gradient's dtype, and the result is multiplied by f/N after it (postscale, AVERAGE). Too
small an f and the partial sums of an fp16 ring overflow at scale; too large and small
gradients are flushed to zero or lose bits as subnormals. This module answers which f is
safe for a world size N, a dtype and a gradient scale, at world sizes no lab has.

The emulator reproduces the ``horovod`` ring bit for bit (:mod:`ddpbench.rules.ring`):

- chunk c of the n-element buffer holds n // p elements plus one for c < n % p;
- chunk c is accumulated in the buffer's dtype as ``acc = x_c[c]``, then
  ``acc = op(acc, x_{(c+k) % p}[c])`` for k = 1..p-1 (the reduce-scatter order);
- prescale before and postscale after the ring with :func:`ddpbench.tensor_ops.scale_`
  (fp16/bf16 scaled in fp32 and rounded once; a factor of exactly 1 is skipped);
- AVERAGE is SUM with the postscale divided by p (float64 division).

``scaling="gpu"`` swaps in Horovod's CUDA rule for fp16 (``ScaleBufferCudaImpl`` in
``horovod/common/ops/cuda/cuda_kernels.cu``): the factor is converted double -> float ->
half (``__float2half``, round to nearest even) and every element is multiplied by it in half
precision (``__hmul``/``__hmul2``: the exact product of two halves, rounded once to half).
Other dtypes scale the same way on either rule (the kernel's generic path multiplies in
the element type's arithmetic, fp32 for bf16 as on CPU).

It runs vectorised over ranks: the buffer is cut into column blocks, each block is copied
once into *step order* (row k holds, for every column in chunk c, rank (c + k) mod p's value:
chunk c's order is the rank order rotated by c, so the copy is two slice copies per chunk),
and the ring then costs p - 1 vector adds over the block. Blocks are independent (a column
never meets another column) and run on threads (NumPy releases the GIL in its loops).
Scaling of 16-bit dtypes goes through a 65,536-entry table built with the backend's own
``scale_`` on every bit pattern, so it is the backend's arithmetic, memoised.

The fp64 reference is the exact mean of the inputs the ranks hold: every fp16 value is an
integer multiple of 2^-24 below 2^16, so up to 2^13 of them sum exactly in float64's 53-bit
significand (for bf16 the float64 sum is within 1e-16 relative of exact).

Example:
    >>> x = np.ones((3, 5), np.float16)                 # 3 ranks, 5 elements each
    >>> ring_allreduce(x, "average", prescale_factor=1 / 3, postscale_factor=3)
    array([1., 1., 1., 1., 1.], dtype=float16)
    >>> predivide_safe_range(1024, "float16", scale=1e2)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ml_dtypes
import numpy as np

from ddpbench.api import ReduceOp
from ddpbench.rules.ring import ring_chunks
from ddpbench.tensor_ops import reduce_ufunc, scale_

__all__ = [
    "MAX_WORLD_SIZE",
    "emulation_cost",
    "DISTRIBUTIONS",
    "DTYPES",
    "Emulation",
    "check_factor",
    "check_world_size",
    "default_factors",
    "emulate",
    "error_metrics",
    "factor_label",
    "gradient_block",
    "mark_safe",
    "predivide_allreduce",
    "predivide_safe_range",
    "resolve_dtype",
    "ring_allreduce",
    "safe_range",
    "scale",
    "sweep_cell",
    "train_least_squares",
    "unit_roundoff",
]

DTYPES = ("float16", "bfloat16", "float32", "float64")
DISTRIBUTIONS = ("normal", "correlated", "heavy_tailed", "layers")

# Elements (ranks x columns) of one block: 8 Mi elements keep every temporary of a block at
# or below 16 MiB, which glibc serves from its heap after the first free (its mmap threshold
# adapts up to 32 MiB); bigger blocks page-fault on every allocation.
BLOCK_ELEMENTS = 1 << 23

# ResNet-50's 161 parameter tensors (torchvision, definition order): the mixture weights of
# the ``layers`` distribution (an element belongs to tensor t with probability size_t / total).
_RESNET50_SIZES = (
    9408, 64, 64, 4096, 64, 64, 36864, 64, 64, 16384, 256, 256, 16384, 256, 256, 16384, 64, 64,
    36864, 64, 64, 16384, 256, 256, 16384, 64, 64, 36864, 64, 64, 16384, 256, 256, 32768, 128,
    128, 147456, 128, 128, 65536, 512, 512, 131072, 512, 512, 65536, 128, 128, 147456, 128, 128,
    65536, 512, 512, 65536, 128, 128, 147456, 128, 128, 65536, 512, 512, 65536, 128, 128, 147456,
    128, 128, 65536, 512, 512, 131072, 256, 256, 589824, 256, 256, 262144, 1024, 1024, 524288,
    1024, 1024, 262144, 256, 256, 589824, 256, 256, 262144, 1024, 1024, 262144, 256, 256, 589824,
    256, 256, 262144, 1024, 1024, 262144, 256, 256, 589824, 256, 256, 262144, 1024, 1024, 262144,
    256, 256, 589824, 256, 256, 262144, 1024, 1024, 262144, 256, 256, 589824, 256, 256, 262144,
    1024, 1024, 524288, 512, 512, 2359296, 512, 512, 1048576, 2048, 2048, 2097152, 2048, 2048,
    1048576, 512, 512, 2359296, 512, 512, 1048576, 2048, 2048, 1048576, 512, 512, 2359296, 512,
    512, 1048576, 2048, 2048, 2048000, 1000,
)


# --------------------------------------------------------------------------- validation


def resolve_dtype(dtype: Any) -> np.dtype:
    """Return the NumPy dtype named by ``dtype`` (a name, a type or a dtype).

    Raises:
        ValueError: not one of :data:`DTYPES` (the emulator covers floating point only).
    """
    name = dtype if isinstance(dtype, str) else None
    if name is None:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = repr(dtype)
    aliases = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
               "single": "float32", "fp64": "float64", "double": "float64"}
    name = aliases.get(name.lower(), name.lower())
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {list(DTYPES)} "
                         "(the numerics emulator covers floating-point gradients)")
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def check_factor(factor: Any, name: str = "predivide factor") -> float:
    """Return ``factor`` as a float after checking it is finite and > 0.

    Raises:
        TypeError: not a real number.
        ValueError: zero, negative, inf or nan (a scale factor must be a positive number).
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(factor).__name__} {factor!r}")
    value = float(factor)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {factor!r} "
                         "(it divides every gradient before the sum)")
    return value


MAX_WORLD_SIZE = 1_000_000
"""Most ranks an emulated ring may have: the contract's most workers
(:data:`ddpbench.contract.MAX_WORKERS`, five times the largest cluster built)."""


def check_world_size(world_size: Any) -> int:
    """Return ``world_size`` as an int after checking it is in [1, :data:`MAX_WORLD_SIZE`].

    Raises:
        TypeError: not an integer.
        ValueError: below 1 (a ring needs at least one rank) or above the bound.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)):
        raise TypeError(f"world size must be an integer, got {type(world_size).__name__} "
                        f"{world_size!r}")
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size} (a ring needs a rank)")
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(f"world size must be <= {MAX_WORLD_SIZE:,} ranks (five times the "
                         f"largest cluster built), got {world_size:,}")
    return int(world_size)


ELEMENTS_PER_SECOND = 1e8
"""Ring steps (element additions) per second of one emulation on this project's 2-core
machine: ``numerics bench`` runs N x n elements at one factor in N x n x 2 / 1e8 s."""
MAX_EMULATION_S = 3600.0
"""Longest one emulation may be estimated to run before it is refused (an hour)."""


def emulation_cost(world_size: int, n: int, dtype: Any, factors: int,
                   threads: int | None = None) -> Any:
    """Return what :func:`emulate` of ``world_size`` ranks x ``n`` elements at ``factors``
    factors will take (a :class:`ddpbench.sizes.Cost`), before it runs.

    Memory: the outputs (``n`` per factor) and the fp64 mean, and per thread three block
    buffers of ranks x columns (:data:`BLOCK_ELEMENTS` elements, or one column of every
    rank when there are more ranks than that). Time: the step-order copy and one ring per
    factor, each ``N x n`` elements, at :data:`ELEMENTS_PER_SECOND`.
    """
    from ddpbench import sizes

    p = check_world_size(world_size)
    item = resolve_dtype(dtype).itemsize
    if n < 1:
        raise ValueError(f"n (elements per rank) must be >= 1, got {n}")
    block = p * max(1, BLOCK_ELEMENTS // p)
    memory = n * (item * factors + 8) + _threads(threads) * 3 * block * item
    seconds = p * n * (1 + factors) / ELEMENTS_PER_SECOND
    over = sizes.overs((seconds > MAX_EMULATION_S,
                        f"more than the limit of {sizes.duration(MAX_EMULATION_S)} for one "
                        f"emulation"))
    return sizes.Cost("this emulation", f"{p:,} ranks x {n:,} elements at {factors} "
                      f"factor{'s' if factors != 1 else ''}", memory, seconds, over)


def _finfo(dtype: np.dtype) -> Any:
    if dtype == np.dtype(ml_dtypes.bfloat16):
        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def unit_roundoff(dtype: Any) -> float:
    """Return 2^-(significand bits): the relative error bound of one rounding in ``dtype``."""
    return float(_finfo(resolve_dtype(dtype)).eps) / 2


# --------------------------------------------------------------------------- scaling


def _is16(dtype: np.dtype) -> bool:
    return dtype.itemsize == 2


SCALING_RULES = ("cpu", "gpu")


def check_scaling(scaling: Any) -> str:
    """Return ``scaling`` ("cpu" or "gpu") or raise naming the bad value."""
    if scaling not in SCALING_RULES:
        raise ValueError(f"scaling must be one of {', '.join(SCALING_RULES)}, got {scaling!r}")
    return str(scaling)


def half_factor(factor: float) -> np.float16:
    """Return the factor as Horovod's CUDA kernel holds it: ``__float2half((float) f)``."""
    with np.errstate(over="ignore"):
        return np.float16(np.float32(factor))


def scale_gpu_half(buf: np.ndarray, factor: float) -> np.ndarray:
    """Return fp16 ``buf`` scaled as Horovod's CUDA kernel does: half factor, half multiply.

    ``__hmul`` rounds the product of two halves once to half; that product is exact in
    float32 (11 + 11 significand bits), so float32 multiply then one rounding is the
    same bits, subnormals included.
    """
    h = half_factor(factor)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        return (buf.astype(np.float32) * np.float32(h)).astype(np.float16)


@functools.lru_cache(maxsize=64)
def _scale_table(dtype_name: str, factor: float, scaling: str = "cpu") -> np.ndarray:
    """Return scale(v, factor) under ``scaling`` for all 65,536 bit patterns v of a 16-bit dtype."""
    dtype = resolve_dtype(dtype_name)
    table = np.arange(1 << 16, dtype=np.uint16).view(dtype).copy()
    if scaling == "gpu" and dtype == np.float16:
        table = scale_gpu_half(table, factor)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            scale_(table, factor)
    table.setflags(write=False)
    return table


# Elements per table lookup: np.take converts the uint16 indices to a temporary intp array;
# kept at 128 Ki elements (1 MiB) it stays in cache.
_TAKE_ELEMENTS = 1 << 17


def _lookup(table: np.ndarray, idx: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Return ``table[idx]`` (into ``out``), in cache-sized groups of rows."""
    if out is None:
        out = np.empty(idx.shape, table.dtype)
    if idx.ndim < 2 or idx.size <= _TAKE_ELEMENTS:
        return table.take(idx, out=out, mode="wrap")
    rows = max(1, _TAKE_ELEMENTS // max(1, idx.shape[1]))
    for r in range(0, idx.shape[0], rows):
        table.take(idx[r:r + rows], out=out[r:r + rows], mode="wrap")
    return out


def scale(buf: np.ndarray, factor: float, scaling: str = "cpu") -> np.ndarray:
    """Return ``buf`` scaled as the ``horovod`` backend scales its fused buffer.

    With ``scaling="cpu"`` the same result as :func:`ddpbench.tensor_ops.scale_` on a copy
    (halves in float32, one rounding); with ``"gpu"`` fp16 follows Horovod's CUDA kernel
    (:func:`scale_gpu_half`). Factor 1 returns ``buf`` itself on both rules (Horovod skips
    the scaling kernel then); 16-bit dtypes go through a lookup table.
    """
    if factor == 1.0:
        return buf
    dtype = buf.dtype
    if _is16(dtype) and dtype.kind in "fV":
        return _lookup(_scale_table(dtype.name, float(factor), scaling), buf.view(np.uint16))
    out = np.array(buf, copy=True)
    with np.errstate(over="ignore", invalid="ignore"):
        scale_(out, factor)
    return out


# --------------------------------------------------------------------------- the ring


def _plan_blocks(n: int, p: int) -> list[tuple[int, int]]:
    """Return the column blocks [lo, hi): they depend on (n, p) only, never on the thread
    count, so data drawn per block (seeded by lo) is the same however the blocks run."""
    cols = max(1, BLOCK_ELEMENTS // p)
    return [(lo, min(n, lo + cols)) for lo in range(0, n, cols)]


def _step_order(xb: np.ndarray, lo: int, hi: int, offsets: np.ndarray, out: np.ndarray) -> None:
    """Copy block ``xb`` (ranks x columns lo..hi) into ``out`` in ring step order.

    ``out[k, j] = xb[(c + k) % p, j]`` for column j of chunk c: chunk c's accumulation
    order is the rank order rotated by c, so each chunk is two slice copies.
    """
    p = xb.shape[0]
    first = int(np.searchsorted(offsets, lo, side="right")) - 1
    c = first
    while c < p and offsets[c] < hi:
        a, b = max(int(offsets[c]), lo) - lo, min(int(offsets[c + 1]), hi) - lo
        if b > a:
            out[: p - c, a:b] = xb[c:, a:b]
            out[p - c:, a:b] = xb[:c, a:b]
        c += 1


def _ring_block(xb: np.ndarray, lo: int, hi: int, offsets: np.ndarray, ufunc: np.ufunc,
                prescale: float, postscale: float, work: np.ndarray | None = None,
                scaling: str = "cpu") -> np.ndarray:
    """Return the ring result for columns lo..hi of the ranks' (unscaled) block ``xb``."""
    p, cols = xb.shape
    xs = scale(xb, prescale, scaling)
    if p == 1:
        acc = np.array(xs[0], copy=True)
    else:
        order = work if work is not None else np.empty((p, cols), xb.dtype)
        _step_order(xs, lo, hi, offsets, order)
        del xs
        acc = _accumulate(order, ufunc)
    return scale(acc, postscale, scaling)


def _accumulate(order: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """Return the ring's reduce-scatter result of a block in step order (p - 1 vector ops)."""
    acc = order[0].copy()
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for k in range(1, order.shape[0]):
            # The backend computes op(received partial sum, own value), in the dtype.
            ufunc(acc, order[k], out=acc)
    return acc


def _offsets(n: int, p: int) -> np.ndarray:
    return np.array([off for off, _ in ring_chunks(n, p)] + [n], dtype=np.int64)


def _threads(threads: int | None) -> int:
    if threads is None:
        threads = min(4, os.cpu_count() or 1)
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return threads


def _scales(op: ReduceOp, p: int, prescale_factor: float,
            postscale_factor: float) -> tuple[float, float]:
    pre = check_factor(prescale_factor, "prescale_factor")
    post = check_factor(postscale_factor, "postscale_factor")
    if op is ReduceOp.AVERAGE:
        post = post / p  # as the backend: AVERAGE folds 1/size into the postscale
    return pre, post


def ring_allreduce(x: np.ndarray | Sequence[np.ndarray], op: ReduceOp | str = ReduceOp.SUM, *,
                   prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                   threads: int | None = None, scaling: str = "cpu") -> np.ndarray:
    """Return what every rank of the ``horovod`` ring holds after ``push_pull``.

    Args:
        x: the ranks' buffers, shape (p, n) or a sequence of p 1-D arrays of one dtype
            (float16, bfloat16, float32 or float64).
        op: SUM, AVERAGE, MIN, MAX or PRODUCT (a :class:`ReduceOp` or its name).
        prescale_factor: multiplies every rank's buffer before the ring.
        postscale_factor: multiplies the result after it (divided by p for AVERAGE).
        threads: column blocks reduced at once (default: up to 4, the CPU count).
        scaling: "cpu" (the backend's and Horovod's CPU rule) or "gpu" (Horovod's CUDA
            rule for fp16: half factor, half multiply).

    Returns:
        The 1-D result (n elements, x's dtype), bit-identical to the backend's.

    Raises:
        ValueError: an empty rank axis, an unknown dtype, a factor <= 0, mismatched
            lengths, an unknown scaling rule.
    """
    op = ReduceOp.parse(op)
    scaling = check_scaling(scaling)
    if not isinstance(x, np.ndarray):
        rows = [np.asarray(r).reshape(-1) for r in x]
        if not rows:
            raise ValueError("world size must be >= 1, got 0 rank buffers")
        lengths = {r.size for r in rows}
        dtypes = {r.dtype for r in rows}
        if len(lengths) > 1 or len(dtypes) > 1:
            raise ValueError(f"rank buffers differ: sizes {sorted(lengths)}, dtypes "
                             f"{sorted(map(str, dtypes))}; every rank must push the same shape")
        x = np.stack(rows)
    if x.ndim != 2:
        raise ValueError(f"x must have shape (ranks, elements), got shape {x.shape}")
    p, n = x.shape
    check_world_size(p)
    dtype = resolve_dtype(x.dtype)
    x = np.ascontiguousarray(x, dtype=dtype)
    pre, post = _scales(op, p, prescale_factor, postscale_factor)
    ufunc = reduce_ufunc(op)
    offsets = _offsets(n, p)
    out = np.empty(n, dtype)
    nthreads = _threads(threads)

    def run(block: tuple[int, int]) -> None:
        lo, hi = block
        out[lo:hi] = _ring_block(x[:, lo:hi], lo, hi, offsets, ufunc, pre, post,
                                 scaling=scaling)

    _map(run, _plan_blocks(n, p), nthreads)
    return out


def predivide_allreduce(x: np.ndarray | Sequence[np.ndarray], factor: float, *,
                        threads: int | None = None, scaling: str = "cpu") -> np.ndarray:
    """Return the ring average with ``gradient_predivide_factor`` = ``factor``.

    As the trainer calls the backend: AVERAGE with prescale 1/factor and postscale factor,
    so the applied postscale is factor / p.
    """
    factor = check_factor(factor)
    return ring_allreduce(x, ReduceOp.AVERAGE, prescale_factor=1.0 / factor,
                          postscale_factor=factor, threads=threads, scaling=scaling)


def _map(fn: Callable[[Any], None], items: list[Any], threads: int) -> None:
    if threads == 1 or len(items) == 1:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        for _ in pool.map(fn, items):
            pass


# --------------------------------------------------------------------------- gradients


@functools.lru_cache(maxsize=1)
def _normal_quantiles() -> np.ndarray:
    """Return the 65,536 midpoint quantiles Phi^-1((i + 1/2) / 65536) of N(0, 1)."""
    probs = (np.arange(1 << 16) + 0.5) / (1 << 16)
    # Start from a sorted sample's quantiles, then Newton on the exact CDF (math.erf).
    x = np.sort(np.random.default_rng(0).standard_normal(1 << 20))[(probs * (1 << 20)).astype(int)]
    cdf = np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2.0)))
    for _ in range(6):
        x = x - (cdf(x) - probs) / (np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))
    q = x.astype(np.float32)
    q.setflags(write=False)
    return q


@functools.lru_cache(maxsize=1)
def _layer_table() -> tuple[np.ndarray, np.ndarray]:
    """Return (cumulative probability, RMS multiplier) per ResNet-50 tensor."""
    sizes = np.array(_RESNET50_SIZES, dtype=np.float64)
    cum = np.cumsum(sizes) / sizes.sum()
    mult = 10.0 ** np.random.default_rng(50).uniform(-1.5, 1.5, sizes.size)
    return cum, mult.astype(np.float32)


def gradient_block(dist: str, scale_: float, world_size: int, lo: int, hi: int, dtype: Any,
                   seed: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """Return columns lo..hi of every rank's gradient, shape (world_size, hi - lo), in dtype.

    Distributions (``scale_`` is the RMS of one rank's gradient element):

    - ``normal``: independent N(0, scale^2) on every rank (pure minibatch noise: the sum
      grows like sqrt(N)). Drawn by inverse CDF on 65,536 exact midpoint quantiles, as fine
      as fp16 itself (tails cut at 4.4 sigma), faster than a normal sampler.
    - ``correlated``: scale * (m + z_r) / sqrt(2) with m shared by all ranks and z_r per
      rank: the mean gradient is as large as the noise, so the sum grows like N.
    - ``heavy_tailed``: Student t with 3 degrees of freedom scaled to RMS ``scale`` (SGD
      gradient noise is heavy-tailed: Simsekli et al., ICML 2019).
    - ``layers``: ``correlated`` with a per-tensor RMS multiplier 10^U(-1.5, 1.5) (per-layer
      gradient norms spread over 2-3 decades, cf. You et al. 2017, LARS); an element
      belongs to a ResNet-50 tensor with probability proportional to its size.

    Columns lo..hi are drawn from a generator seeded with (seed, world_size, lo): a block
    is reproducible on its own, whatever thread draws it.

    Args:
        out: optional (world_size, hi - lo) array of ``dtype`` to fill (saves allocations).

    Raises:
        ValueError: unknown distribution or dtype, scale <= 0, world size < 1.
    """
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {dist!r}; valid: {list(DISTRIBUTIONS)}")
    s = check_factor(scale_, "gradient scale")
    p = check_world_size(world_size)
    dtype = resolve_dtype(dtype)
    cols = hi - lo
    if out is None:
        out = np.empty((p, cols), dtype)
    rng = np.random.default_rng([seed, p, lo])
    # Rows are drawn in groups of <= 128 Ki elements so temporaries stay in cache.
    group = max(1, _TAKE_ELEMENTS // max(cols, 1))
    if dist == "normal":
        table = _normal_values(s, dtype.name)
        for r in range(0, p, group):
            rows = min(group, p - r)
            table.take(_uniform16(rng, rows * cols).reshape(rows, cols), out=out[r:r + rows],
                       mode="wrap")
        return out
    if dist == "heavy_tailed":
        for r in range(0, p, group):
            rows = min(group, p - r)
            out[r:r + rows] = rng.standard_t(3, size=(rows, cols)) * (s / math.sqrt(3.0))
        return out
    m = rng.standard_normal(cols, dtype=np.float32)
    col_scale = np.full(cols, s / math.sqrt(2.0), np.float32)
    if dist == "layers":
        cum, mult = _layer_table()
        layer = np.minimum(np.searchsorted(cum, rng.random(cols)), mult.size - 1)
        col_scale *= mult[layer]
    q = _normal_quantiles()
    for r in range(0, p, group):
        rows = min(group, p - r)
        z = q.take(_uniform16(rng, rows * cols).reshape(rows, cols), mode="wrap")
        z += m
        z *= col_scale
        out[r:r + rows] = z
    return out


def _uniform16(rng: np.random.Generator, count: int) -> np.ndarray:
    """Return ``count`` uniform 16-bit integers (four per raw 64-bit draw)."""
    raw = rng.bit_generator.random_raw(-(-count // 4))
    return raw.view(np.uint16)[:count]


@functools.lru_cache(maxsize=32)
def _normal_values(s: float, dtype_name: str) -> np.ndarray:
    """Return the 65,536 N(0, s^2) quantiles rounded to the dtype (a lookup table)."""
    table = (_normal_quantiles() * np.float32(s)).astype(resolve_dtype(dtype_name))
    table.setflags(write=False)
    return table


# --------------------------------------------------------------------------- emulation


class Emulation:
    """Results of :func:`emulate`: ``outputs[f]`` per predivide factor and the fp64 ``reference``."""

    def __init__(self, outputs: dict[float, np.ndarray], reference: np.ndarray,
                 dtype: np.dtype, world_size: int) -> None:
        self.outputs = outputs
        self.reference = reference
        self.dtype = dtype
        self.world_size = world_size

    def metrics(self, factor: float) -> dict[str, Any]:
        """Return :func:`error_metrics` of the output at ``factor``."""
        return error_metrics(self.outputs[factor], self.reference, self.dtype)


def emulate(source: Callable[[int, int, Any], np.ndarray], world_size: int, n: int, dtype: Any,
            factors: Iterable[float], *, threads: int | None = None,
            scaling: str = "cpu") -> Emulation:
    """Run the predivide ring average at several factors over data drawn block by block.

    Args:
        source: ``source(lo, hi, out)`` returns columns lo..hi of every rank's buffer,
            shape (world_size, hi - lo), in ``dtype``; ``out`` is a scratch array of that
            shape it may fill and return. Called once per block, so the whole
            (world_size x n) gradient never has to exist at once.
        world_size: ranks p (>= 1).
        n: elements per rank.
        dtype: gradient dtype.
        factors: predivide factors (> 0): prescale 1/f, postscale f, AVERAGE.
        threads: blocks reduced at once (default up to 4).
        scaling: "cpu" or "gpu" (Horovod's CUDA fp16 rule), as :func:`ring_allreduce`.

    Returns:
        An :class:`Emulation` with the n-element output per factor and the fp64 mean.
    """
    p = check_world_size(world_size)
    dtype = resolve_dtype(dtype)
    scaling = check_scaling(scaling)
    facs = [check_factor(f) for f in factors]
    if not facs:
        raise ValueError("factors is empty; give at least one predivide factor")
    if n < 1:
        raise ValueError(f"n (elements per rank) must be >= 1, got {n}")
    offsets = _offsets(n, p)
    add = reduce_ufunc(ReduceOp.SUM)
    outs = {f: np.empty(n, dtype) for f in facs}
    ref = np.empty(n, np.float64)
    nthreads = _threads(threads)
    local = threading.local()

    def buffers(cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Reused across a thread's blocks: fresh large arrays per block cost page faults.
        if getattr(local, "cols", None) != cols:
            local.cols = cols
            local.bufs = tuple(np.empty((p, cols), dtype) for _ in range(3))
        return local.bufs

    def run(block: tuple[int, int]) -> None:
        lo, hi = block
        data, rot, work = buffers(hi - lo)
        xb = source(lo, hi, data)
        if xb.shape != (p, hi - lo) or xb.dtype != dtype:
            raise ValueError(f"source({lo}, {hi}) gave {xb.dtype}{list(xb.shape)}, "
                             f"expected {dtype}[{p}, {hi - lo}]")
        ref[lo:hi] = xb.sum(axis=0, dtype=np.float64) / p
        if p == 1:
            for f in facs:
                pre, post = _scales(ReduceOp.AVERAGE, p, 1.0 / f, f)
                outs[f][lo:hi] = scale(scale(xb[0], pre, scaling), post, scaling)
            return
        # Scaling is element-wise, so step order is taken once and shared by all factors.
        _step_order(xb, lo, hi, offsets, rot)
        del xb
        for f in facs:
            pre, post = _scales(ReduceOp.AVERAGE, p, 1.0 / f, f)
            acc = _accumulate(_scale_into(rot, pre, work, scaling), add)
            outs[f][lo:hi] = scale(acc, post, scaling)

    _map(run, _plan_blocks(n, p), nthreads)
    return Emulation(outs, ref, dtype, p)


def _scale_into(x: np.ndarray, factor: float, out: np.ndarray,
                scaling: str = "cpu") -> np.ndarray:
    """Return ``scale(x, factor, scaling)``, written into ``out`` where that saves an allocation."""
    if factor == 1.0:
        return x
    if _is16(x.dtype):
        return _lookup(_scale_table(x.dtype.name, float(factor), scaling), x.view(np.uint16),
                       out)
    return scale(x, factor, scaling)


def error_metrics(out: np.ndarray, ref: np.ndarray, dtype: Any) -> dict[str, Any]:
    """Compare a ring result with its fp64 reference.

    Returns:
        A dict: ``overflow`` (inf/nan where the reference is finite), ``underflow`` (zero or
        subnormal where the reference is a normal number of the dtype), their fractions,
        ``max_rel_err`` and ``mean_rel_err`` (element-wise |out - ref| / |ref| over finite
        outputs with ref != 0), ``rel_l2_err`` (||out - ref|| / ||ref|| over finite
        outputs: the error an optimizer step sees) and ``n``.
    """
    dtype = resolve_dtype(dtype)
    o = out.astype(np.float64)
    finite = np.isfinite(o)
    ref_fin = np.isfinite(ref)
    tiny = float(_finfo(dtype).smallest_normal)
    overflow = int(np.count_nonzero(~finite & ref_fin))
    underflow = int(np.count_nonzero((np.abs(o) < tiny) & (np.abs(ref) >= tiny) & ref_fin))
    ok = finite & ref_fin
    diff = np.abs(o[ok] - ref[ok])
    r = np.abs(ref[ok])
    nz = r > 0
    rel = diff[nz] / r[nz]
    ref_norm = float(np.sqrt(np.sum(r * r)))
    err_norm = float(np.sqrt(np.sum(diff * diff)))
    n = int(out.size)
    return {
        "n": n,
        "overflow": overflow,
        "overflow_frac": overflow / n,
        "underflow": underflow,
        "underflow_frac": underflow / n,
        "max_rel_err": float(rel.max()) if rel.size else 0.0,
        "mean_rel_err": float(rel.mean()) if rel.size else 0.0,
        "rel_l2_err": err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf),
        "max_abs_ref": float(r.max()) if r.size else 0.0,
    }


# --------------------------------------------------------------------------- sweeps


def default_factors(world_size: int, *, max_exp: int = 24, step: int = 2) -> list[float]:
    """Return the factor grid 2^0, 2^step, ..., 2^max_exp plus sqrt(N) and N, sorted."""
    p = check_world_size(world_size)
    grid = {float(2.0 ** e) for e in range(0, max_exp + 1, step)}
    grid |= {math.sqrt(p), float(p)}
    return sorted(grid)


def factor_label(factor: float, world_size: int) -> str:
    """Return how a factor is named in tables: 'N', 'sqrt(N)' or its value."""
    if factor == float(world_size):
        return "N"
    if factor == math.sqrt(world_size):
        return "sqrt(N)"
    return f"{factor:g}"


def sweep_cell(dtype: str, dist: str, scale_: float, world_size: int,
               factors: Sequence[float], n: int, seed: int = 0,
               threads: int | None = None, scaling: str = "cpu") -> list[dict[str, Any]]:
    """Emulate one (dtype, distribution, scale, N) cell at every factor; one row per factor.

    The gradient is drawn once and shared by all factors, so factors compare on equal data.
    ``scaling`` picks Horovod's CPU or GPU (CUDA fp16) scaling rule.
    """
    dt = resolve_dtype(dtype)
    p = check_world_size(world_size)
    emu = emulate(lambda lo, hi, out: gradient_block(dist, scale_, p, lo, hi, dt, seed, out),
                  p, n, dt, factors, threads=threads, scaling=scaling)
    rows = []
    for f in emu.outputs:
        rows.append({"dtype": dt.name, "dist": dist, "scale": float(scale_), "world_size": p,
                     "factor": f, "factor_label": factor_label(f, p), "elements": n,
                     "seed": seed, **emu.metrics(f)})
    return rows


def mark_safe(rows: list[dict[str, Any]], *, err_ratio: float = 2.0,
              underflow_tol: float = 1e-3) -> list[dict[str, Any]]:
    """Add ``best_rel_l2_err`` and ``safe`` to rows of one or more cells (in place).

    A factor is safe for a cell (dtype, distribution, scale, N) when:

    - it gives no overflow (no inf/nan in the result);
    - its underflow fraction exceeds the cell's least by at most ``underflow_tol`` (sums
      that cancel to exactly zero count as underflow at every factor; only the excess is
      the factor's doing);
    - its ``rel_l2_err`` is at most max(err_ratio x the best factor's, err_ratio x unit
      roundoff): the factor costs at most a small constant over the best accuracy the ring
      can give at this N (which fp16 accumulation itself limits).
    """
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["dtype"], r["dist"], r["scale"], r["world_size"]), []).append(r)
    for (dtype, *_), group in cells.items():
        finite = [r for r in group if r["overflow"] == 0]
        best = min((r["rel_l2_err"] for r in finite), default=math.inf)
        least_uf = min((r["underflow_frac"] for r in finite), default=0.0)
        tol = max(err_ratio * best, err_ratio * unit_roundoff(dtype))
        for r in group:
            r["best_rel_l2_err"] = best
            r["safe"] = bool(r["overflow"] == 0
                             and r["underflow_frac"] <= least_uf + underflow_tol
                             and r["rel_l2_err"] <= tol)
    return rows


def safe_range(rows: Iterable[dict[str, Any]]) -> tuple[float, float] | None:
    """Return (smallest, largest) safe factor of one cell's marked rows, or None."""
    safe = sorted(r["factor"] for r in rows if r.get("safe"))
    return (safe[0], safe[-1]) if safe else None


def predivide_safe_range(world_size: int, dtype: Any = "float16", *, scale: float = 1.0,
                         dist: str = "normal", n: int = 1 << 16, factors: Sequence[float] | None = None,
                         seed: int = 0) -> dict[str, Any]:
    """Answer "which predivide factors are safe for N ranks, this dtype, gradients ~scale?".

    Returns:
        ``{"range": (lo, hi) or None, "rows": [per-factor metrics with 'safe']}``.
    """
    p = check_world_size(world_size)
    facs = list(factors) if factors is not None else default_factors(p)
    rows = mark_safe(sweep_cell(resolve_dtype(dtype).name, dist, scale, p, facs, n, seed))
    return {"range": safe_range(rows), "rows": rows}


# --------------------------------------------------------------------------- training


def train_least_squares(factor: float | None, *, world_size: int = 1024, dim: int = 64,
                        batch: int = 16, steps: int = 150, lr: float = 0.1,
                        loss_scale: float = 1024.0, dtype: Any = "float16",
                        seed: int = 0) -> dict[str, Any]:
    """Train a least-squares model with gradients communicated through the emulated ring.

    The model: w in R^dim, data rows a ~ N(0, I), targets y = a . w* + 0.01 noise,
    loss 0.5 * mean (a . w - y)^2. Each of ``world_size`` simulated workers computes its
    minibatch gradient in fp32, multiplies it by ``loss_scale`` (as mixed-precision training
    does to keep small gradients representable), casts it to ``dtype`` and the workers
    average it with the ring at predivide ``factor`` (``None``: exact fp64 average, the
    baseline). The average is unscaled in fp32 and applied with plain SGD. A non-finite
    gradient is applied as is (no dynamic loss scaling), so overflow shows as divergence.

    Returns:
        ``{"factor", "loss" (per step, fp64), "final_loss", "overflow_steps", "grad_rms0",
        "grad_rms_last", "diverged_at"}``: the RMS of the workers' scaled gradients at the
        first and last step (training shrinks them: a factor must be safe for both), and
        the first step whose loss is not finite (None if none).
    """
    dt = resolve_dtype(dtype)
    p = check_world_size(world_size)
    rng = np.random.default_rng(seed)
    w_star = rng.standard_normal(dim)
    w = np.zeros(dim, np.float32)
    losses: list[float] = []
    overflow_steps = 0
    grad_rms0 = None
    eval_a = rng.standard_normal((4096, dim))
    eval_y = eval_a @ w_star
    for _ in range(steps):
        a = rng.standard_normal((p, batch, dim)).astype(np.float32)
        y = np.einsum("pbd,d->pb", a, w_star) + 0.01 * rng.standard_normal((p, batch))
        resid = np.einsum("pbd,d->pb", a, w) - y.astype(np.float32)
        grads = np.einsum("pbd,pb->pd", a, resid) / np.float32(batch) * np.float32(loss_scale)
        with np.errstate(over="ignore", invalid="ignore"):
            g = grads.astype(np.float32).astype(dt)
            grad_rms = float(np.sqrt(np.mean(np.square(g.astype(np.float64)))))
        if grad_rms0 is None:
            grad_rms0 = grad_rms
        if factor is None:
            avg = g.astype(np.float64).mean(axis=0)
        else:
            avg = predivide_allreduce(g, factor, threads=1).astype(np.float64)
        if not np.all(np.isfinite(avg)):
            overflow_steps += 1
        with np.errstate(over="ignore", invalid="ignore"):
            w = (w - np.float32(lr) * (avg / loss_scale).astype(np.float32)).astype(np.float32)
            err = eval_a @ w.astype(np.float64) - eval_y
            losses.append(float(0.5 * np.mean(err * err)))
    bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    return {"factor": factor, "loss": losses, "final_loss": losses[-1],
            "overflow_steps": overflow_steps, "grad_rms0": grad_rms0,
            "grad_rms_last": grad_rms, "diverged_at": bad[0] + 1 if bad else None}
