"""Gradient compression for :class:`~ddpbench.torch.DistributedOptimizer` (Horovod's API).

A compressor turns a gradient into the tensor that travels and back:
``compress(tensor) -> (wire, ctx)``, ``decompress(wire, ctx) -> tensor``. Choices, as in
``horovod.torch.Compression``, plus bfloat16:

========  =====================================================================
none      the gradient itself travels (reduced in place, no copy)
fp16      floating-point gradients travel as float16 and are cast back
bf16      floating-point gradients travel as bfloat16 (fp32's range, 8-bit
          mantissa: no overflow, coarser rounding)
========  =====================================================================
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compression", "Compressor"]


class Compressor:
    """Compress a tensor for the wire and restore it; the default sends it unchanged."""

    name = "none"
    wire_dtype: torch.dtype | None = None

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return the tensor to send and what :meth:`decompress` needs to undo it."""
        if cls.wire_dtype is None or not tensor.is_floating_point() \
                or tensor.dtype == cls.wire_dtype:
            return tensor, None
        return tensor.to(cls.wire_dtype), tensor.dtype

    @classmethod
    def decompress(cls, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Return ``tensor`` in the dtype it had before :meth:`compress`."""
        return tensor if ctx is None else tensor.to(ctx)


class NoneCompressor(Compressor):
    """Send gradients as they are."""


class FP16Compressor(Compressor):
    """Send floating-point gradients as float16."""

    name = "fp16"
    wire_dtype = torch.float16


class BF16Compressor(Compressor):
    """Send floating-point gradients as bfloat16."""

    name = "bf16"
    wire_dtype = torch.bfloat16


class Compression:
    """The compressors by name: ``Compression.none``, ``.fp16``, ``.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @classmethod
    def parse(cls, value: str | type[Compressor] | None) -> type[Compressor]:
        """Return the compressor named by ``value`` (a name, a compressor class or None).

        Raises:
            ValueError: an unknown name or object.
        """
        if value is None:
            return cls.none
        if isinstance(value, type) and issubclass(value, Compressor):
            return value
        if isinstance(value, str) and value in ("none", "fp16", "bf16"):
            return getattr(cls, value)
        raise ValueError(f"unknown compression {value!r}; valid: 'none', 'fp16', 'bf16' or "
                         f"Compression.none/.fp16/.bf16")
