"""The ``accuracy`` kind's keys: the training run and the variants to compare."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NOISE_SIGMAS = 2.0  # a difference beyond this many standard errors is told from noise


class Variant(BaseModel):
    """Backends and the settings to grid over for them.

    Attributes:
        backends: the backends that run this variant.
        compression: gradient compression: ``none`` or ``fp16``.
        predivide: ``gradient_predivide_factor`` values.
        local_sgd_period: local SGD's period in steps (``collective``'s ``local_sgd``
            mode); 0 = off.
        knobs: backend knobs for these runs.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    backends: list[str] = Field(min_length=1)
    compression: list[Literal["none", "fp16"]] = ["none"]
    predivide: list[float] = Field(default=[1.0], min_length=1)
    local_sgd_period: list[int] = Field(default=[0], min_length=1)
    knobs: dict[str, int | float | str | bool] = {}


class Spec(BaseModel):
    """The keys of an ``accuracy`` experiment.

    Attributes:
        workers: worker processes of each training job.
        servers: the parameter-server backends' servers: ``colocated`` or a count.
        steps: training steps of each run.
        batch_size: samples per worker and step.
        lr: the learning rate at the first step.
        lr_schedule: ``cosine`` decay over the steps, or ``constant``.
        momentum: SGD momentum.
        seed: the first repetition's seed (``seed + 1``, ... for the next).
        eval_every: steps between evaluations of worker 0's replica on the test set.
        timeout_s: a run's job is killed after this many seconds and its row fails.
        variants: the backends and settings to compare (:class:`Variant`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str = Field("mlp", description="mlp | cnn (ddpbench.nn, NumPy), or a PyTorch "
                       "model as `ddpbench profile` takes it: torchvision:NAME, "
                       "package.module:factory")
    dataset: str = Field("synthetic", description="synthetic | digits | mnist5k, a .npz "
                         "file or an image folder")
    target_acc: float | None = Field(None, ge=0, le=100, description="fp32 test accuracy "
                                     "(%) every backend must reach; none: no check")
    workers: int = Field(4, ge=1, le=64)
    servers: int | Literal["colocated"] = "colocated"
    steps: int = Field(400, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.1, gt=0)
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    momentum: float = Field(0.9, ge=0)
    seed: int = 0
    eval_every: int = Field(20, ge=1)
    repetitions: int = Field(1, ge=1, description="runs per point, seeds seed, seed+1, ... "
                             "(3 or more: the report gives mean +- spread)")
    timeout_s: float = Field(600.0, gt=0)
    variants: list[Variant] = Field(min_length=1)

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if value in ("mlp", "cnn"):
            return value
        if ":" not in value or value.startswith(":") or value.endswith(":"):
            raise ValueError(f"expected mlp, cnn, torchvision:NAME or package.module:factory, "
                             f"got {value!r}")
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        if value in ("synthetic", "digits", "mnist5k") or value.endswith(".npz") \
                or Path(value).is_dir():
            return value
        raise ValueError(f"expected synthetic, digits, mnist5k, a .npz file or an image "
                         f"folder, got {value!r}")


RUN_KEYS = ("model", "dataset", "workers", "servers", "steps", "batch_size", "lr", "lr_schedule",
             "momentum", "seed", "eval_every", "timeout_s")
NAMED_DEFAULTS = {"compression": "none", "predivide": 1.0, "local_sgd_period": 0}


