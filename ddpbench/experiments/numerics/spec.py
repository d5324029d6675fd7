"""The ``numerics`` kind's keys: world sizes, factors, dtypes, distributions, training."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ddpbench import numerics as nm


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FactorGrid(_Frozen):
    """Predivide factors 2^0, 2^step, ..., 2^max_exp, plus ``extra`` and sqrt(N), N.

    Attributes:
        include_sqrt_n: add sqrt(N) at each world size N.
        include_n: add N itself (the predivide factor of a plain average).
    """

    max_exp: int = Field(24, ge=0, le=60, description="largest factor is 2^max_exp")
    step: int = Field(2, ge=1, le=60, description="exponent step of the grid")
    extra: tuple[float, ...] = Field((), description="further factors (> 0)")
    include_sqrt_n: bool = True
    include_n: bool = True

    @field_validator("extra")
    @classmethod
    def _positive(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        for f in value:
            nm.check_factor(f, "factors.extra value")
        return value

    def for_world(self, world_size: int) -> list[float]:
        """Return the sorted factors used at ``world_size`` ranks."""
        grid = {float(2.0 ** e) for e in range(0, self.max_exp + 1, self.step)}
        grid |= {float(f) for f in self.extra}
        if self.include_sqrt_n:
            grid.add(math.sqrt(world_size))
        if self.include_n:
            grid.add(float(world_size))
        return sorted(grid)

    def grid(self) -> list[float]:
        """Return the factors shared by every world size (the heatmaps' columns)."""
        return sorted({float(2.0 ** e) for e in range(0, self.max_exp + 1, self.step)}
                      | {float(f) for f in self.extra})


class Distribution(_Frozen):
    """A gradient distribution and the scales (RMS of one rank's element) to sweep.

    Attributes:
        name: how each rank's gradient is drawn (:func:`ddpbench.numerics.gradient_block`):
            ``normal``, ``correlated`` (a part shared by all ranks), ``heavy_tailed``
            (Student t, 3 degrees of freedom) or ``layers`` (``correlated`` with a
            per-tensor RMS multiplier).
        scales: the RMS values of one rank's element to sweep.
    """

    name: Literal["normal", "correlated", "heavy_tailed", "layers"]
    scales: tuple[float, ...] = Field(min_length=1)

    @field_validator("scales")
    @classmethod
    def _positive(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        for s in value:
            nm.check_factor(s, "distribution scale")
        return value


class SafeCriteria(_Frozen):
    """When a factor counts as safe (see :func:`ddpbench.numerics.mark_safe`)."""

    err_ratio: float = Field(2.0, ge=1.0, description="allowed error over the cell's best")
    underflow_tol: float = Field(1e-3, ge=0.0, le=1.0, description="allowed underflow fraction")


class Training(_Frozen):
    """The least-squares training run with fp16 communication (numerics.train_least_squares).

    Attributes:
        world_size: simulated workers averaging through the emulated ring.
        factors: the predivide factors trained with (beside the exact fp64 average).
        steps: SGD steps of each run.
        dim: parameters of the least-squares model.
        dtype: the dtype the gradients are communicated in.
    """

    world_size: int = Field(1024, ge=1)
    scale: float = Field(100.0, gt=0, description="target RMS of one worker's first gradient")
    factors: tuple[float, ...] = (1.0, 32.0, 1024.0, 16777216.0)
    steps: int = Field(150, ge=1)
    dim: int = Field(64, ge=1)
    batch: int = Field(16, ge=1, description="samples per worker and step")
    dtype: Literal["float16", "bfloat16"] = "float16"

    @field_validator("factors")
    @classmethod
    def _positive(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        for f in value:
            nm.check_factor(f, "training factor")
        return value


GPU_LABEL = "float16_gpu"
"""The maps of float16 under Horovod's CUDA scaling rule."""


class Spec(_Frozen):
    """The keys of a ``kind: numerics`` experiment file.

    Attributes:
        world_sizes: the ranks N of the emulated ring allreduce to map.
        factors: the predivide factors tried at each N (:class:`FactorGrid`).
        dtypes: the dtypes the gradients are communicated in.
        distributions: the gradient distributions and scales (:class:`Distribution`).
        seed: seed of the drawn gradients and of the training run.
        safe: when a factor counts as safe (:class:`SafeCriteria`).
        training: the training run with fp16 communication (:class:`Training`); ``None``
            = none.
    """

    world_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    factors: FactorGrid = FactorGrid()
    dtypes: tuple[Literal["float16", "bfloat16", "float32"], ...] = ("float16", "bfloat16")
    scalings: tuple[Literal["cpu", "gpu"], ...] = Field(("cpu",), description=(
        "scaling rules to map: 'cpu' scales halves in fp32 (Horovod on CPU); 'gpu' is "
        "Horovod's CUDA kernel (factor rounded to half, product in half), float16 only, "
        "drawn as the maps of 'float16_gpu'"))
    distributions: tuple[Distribution, ...] = (
        Distribution(name="normal", scales=(1e-4, 1e-2, 1.0, 100.0)),)
    elements: int = Field(8192, ge=1, le=1 << 24, description="elements per rank")
    seed: int = 0
    safe: SafeCriteria = SafeCriteria()
    training: Training | None = Training()

    @field_validator("world_sizes")
    @classmethod
    def _worlds(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("world_sizes is empty; give at least one world size >= 1")
        for n in value:
            nm.check_world_size(n)
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _nonempty(self) -> Spec:
        if not self.dtypes or not self.distributions:
            raise ValueError("dtypes and distributions must each name at least one entry")
        if not self.scalings:
            raise ValueError("scalings must name at least one rule: cpu, gpu")
        if "gpu" in self.scalings and "float16" not in self.dtypes:
            raise ValueError("scalings: 'gpu' is Horovod's CUDA rule for float16; add "
                             "float16 to dtypes")
        return self

    def map_labels(self) -> list[str]:
        """Return the maps drawn: each dtype (CPU rule), then ``float16_gpu`` if asked."""
        labels: list[str] = list(self.dtypes) if "cpu" in self.scalings else []
        if "gpu" in self.scalings:
            labels.append(GPU_LABEL)
        return labels


