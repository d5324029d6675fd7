"""Zero-copy views of torch tensors as the arrays the KVStore backends take.

CPU tensors become NumPy arrays over the same memory (``Tensor.numpy()``); bfloat16, which
NumPy lacks, is viewed as int16 and then as ``ml_dtypes.bfloat16``, still without a copy.
CUDA tensors go to CuPy through DLPack. A tensor that is not contiguous cannot be shared
as a C-contiguous array; :func:`staging` gives the caller a contiguous copy to send and
write back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ddpbench.tensor_ops import BFLOAT16

# torch dtypes the real backends reduce (ddpbench.backends._common.check_dtype accepts the
# same: floats incl. bfloat16 and integers); bool and complex have no sum on the wire.
REDUCIBLE = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
})


def check_reducible(name: str, tensor: torch.Tensor) -> None:
    """Raise TypeError when no backend can reduce ``tensor``'s dtype."""
    if tensor.dtype not in REDUCIBLE:
        valid = sorted(str(d).removeprefix("torch.") for d in REDUCIBLE)
        raise TypeError(f"parameter {name!r} has dtype {str(tensor.dtype).removeprefix('torch.')}"
                        f", which the backends cannot reduce; supported: {valid}")


def as_array(tensor: torch.Tensor) -> Any:
    """Return a NumPy (CPU) or CuPy (CUDA) array sharing ``tensor``'s memory.

    Raises:
        ValueError: ``tensor`` is not contiguous (use :func:`staging`).
        ImportError: a CUDA tensor without CuPy installed.
    """
    t = tensor.detach()
    if not t.is_contiguous():
        raise ValueError("only contiguous tensors can be shared with the backends")
    if t.device.type == "cuda":
        from ddpbench.gpu import cupy_or_raise

        return cupy_or_raise().from_dlpack(t)
    if t.device.type != "cpu":
        raise ValueError(f"tensors on device {t.device} are not supported; use cpu or cuda")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def staging(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Return ``(tensor, False)`` when it can be shared, else ``(contiguous copy, True)``."""
    if tensor.is_contiguous():
        return tensor, False
    return tensor.contiguous(), True


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """Return the NumPy dtype that :func:`as_array` gives for ``dtype``."""
    if dtype == torch.bfloat16:
        assert BFLOAT16 is not None  # ml_dtypes is a dependency of ddpbench
        return BFLOAT16
    return torch.empty((), dtype=dtype).numpy().dtype
