"""The ``accuracy`` kind's keys: the training run and the variants to compare."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FP32_SPREAD_TARGET = 0.1  # points of accuracy between fp32 backends
FP16_TARGET = 0.5  # points of accuracy between fp16 and fp32 of the same backend


class Variant(BaseModel):
    """Backends and the settings to grid over for them."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    backends: list[str] = Field(min_length=1)
    compression: list[Literal["none", "fp16"]] = ["none"]
    predivide: list[float] = Field(default=[1.0], min_length=1)
    local_sgd_period: list[int] = Field(default=[0], min_length=1)
    knobs: dict[str, int | float | str | bool] = {}


class Spec(BaseModel):
    """The keys of an ``accuracy`` experiment."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: Literal["mlp", "cnn"] = "mlp"
    dataset: Literal["synthetic", "digits"] = "synthetic"
    workers: int = Field(4, ge=1, le=64)
    servers: int | Literal["colocated"] = "colocated"
    steps: int = Field(400, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.1, gt=0)
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    momentum: float = Field(0.9, ge=0)
    seed: int = 0
    eval_every: int = Field(20, ge=1)
    repetitions: int = Field(1, ge=1, description="runs per point, seeds seed, seed+1, ...")
    timeout_s: float = Field(600.0, gt=0)
    variants: list[Variant] = Field(min_length=1)


RUN_KEYS = ("model", "dataset", "workers", "servers", "steps", "batch_size", "lr", "lr_schedule",
             "momentum", "seed", "eval_every", "timeout_s")
NAMED_DEFAULTS = {"compression": "none", "predivide": 1.0, "local_sgd_period": 0}


