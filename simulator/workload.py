"""Workload profiles: parameter tensors and per-layer compute times of one training step.

A profile is a YAML mapping (the shipped ones live in ``simulator/profiles/``)::

    name: tiny
    batch_size: 32              # samples per worker per iteration
    gpu: "V100, fp32"           # what the times stand for (free text)
    device: V100                # the device of ddpbench.hardware.DEVICES they were taken on
    matmul_fraction: 0.7        # share of the time in matrix products (device rescaling)
    precision: fp32             # the arithmetic the times were taken in (fp32 if absent)
    mixed_precision_speedup: 3  # measured mixed-precision speedup on device (precision: mixed)
    layers:                     # forward order; backward runs them in reverse
      - name: fc1
        fwd_ms: 1.5
        bwd_ms: 3.0
        tensors:                # parameter tensors, in the order the framework creates them
          - {name: fc1.weight, numel: 1024}
          - {name: fc1.bias, numel: 32}

``device`` and ``matmul_fraction`` are optional; without them a point may not name a
``device`` or ``batch_size`` other than the profile's (see :func:`ddpbench.hardware.compute_factor`).
``mixed_precision_speedup`` is optional too; without it a point may not run ``precision:
mixed``. ``seq_len`` (optional) says the samples are sequences of that many tokens: such a
profile's compute grows linearly with a point's ``batch_size`` (no half-saturation batch:
one sequence of thousands of tokens already fills a GPU's matrix products). ``precision`` (``fp32``, ``tf32``, ``fp16``, ``bf16`` or ``fp8``; fp32 if absent) is
what a point's own ``precision`` is rescaled from (:func:`ddpbench.hardware.precision_factor`).

A profile written by ``ddpbench profile`` (:mod:`ddpbench.profiling`) also records how it
was measured, all optional and ignored by the simulator: a top-level ``measured`` mapping
(tool, torch version, device, batch, input shape, repeats, step times and their spread) and,
per tensor, ``shape``, ``dtype``, ``bytes`` and ``ready_ms`` (when its gradient became ready,
milliseconds after the backward pass began).

Tensors are numbered in file order: that number is the tensor's key for the parameter-server
placement rules of each backend (:mod:`ddpbench.rules.placement`, docs/fidelity/).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ddpbench import hardware, safeyaml

__all__ = ["WORKLOADS", "Layer", "Tensor", "Workload", "load_workload"]

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
WORKLOADS: tuple[str, ...] = ("resnet50", "vgg19", "seq2seq_lstm", "bert_base", "vgg16",
                              "resnet101", "inception_v3", "transformer_big", "bert_large",
                              "gpt2_xl", "sockeye", "llama_1b", "llama_7b", "llama_13b",
                              "llama_70b", "llama3_8b", "llama3_70b", "vit_l", "mpt_7b",
                              "mpt_13b", "mpt_70b", "resnet152", "alexnet")
_BLOCK = re.compile(r"^(?:.*\.)?(?:layers|blocks|layer|h)\.(?:encoder_layer_)?\d+(?=\.|$)")
"""A layer name's prefix up to a transformer block's index (``model.layers.3``)."""
_NOT_LINEAR = ("norm", "embed", "ln_", ".ln", "bn", "bias")
"""Parameter-name parts that mark a weight as no linear layer's (norms, embeddings)."""
ITEMSIZE = 4
"""Bytes per gradient element at the default precision (fp32). A point's own item size
follows its ``precision`` (:func:`ddpbench.hardware.gradient_bytes`): the simulator hands it
to the strategies as ``SimContext.itemsize``."""


class Tensor(BaseModel):
    """One parameter tensor: its gradient is what gets communicated."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    numel: int = Field(gt=0, description="number of elements")
    layer: int = Field(ge=0, description="index of the layer that owns it")
    shape: tuple[int, ...] | None = Field(None, description="shape, when the profile records it")
    dtype: str = Field("", description="the parameter's dtype, when recorded (gradients "
                                       "travel as fp32 regardless)")
    ready_ms: float | None = Field(None, ge=0, description="measured gradient-ready time, ms "
                                                          "after the backward pass began")


class Layer(BaseModel):
    """One layer: forward and backward seconds for one iteration at the profile's batch."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    fwd_s: float = Field(ge=0)
    bwd_s: float = Field(ge=0)


class Workload(BaseModel):
    """A model to train: layers in forward order and their parameter tensors in creation order.

    Build one with :func:`load_workload` (a shipped name or a YAML file) or
    :meth:`from_dict` (the YAML structure as a mapping).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    batch_size: int = Field(gt=0)
    gpu: str = ""
    device: str = ""
    matmul_fraction: float | None = Field(None, ge=0, le=1)
    precision: str = Field("fp32", description="the arithmetic the times were taken in "
                                               "(ddpbench.hardware.ACTIVATION_BYTES' keys)")
    seq_len: int | None = Field(None, gt=0, description="tokens per sample, for a profile "
                                "whose samples are token sequences (its compute then grows "
                                "linearly with the batch)")
    mixed_precision_speedup: float | None = Field(None, gt=1, description="how much faster "
                                                  "the model trains in mixed precision than "
                                                  "in fp32 on ``device`` (measured)")
    notes: str = ""
    measured: dict[str, Any] | None = Field(None, description="how a profiled workload was "
                                            "measured (ddpbench profile); free-form")
    layers: tuple[Layer, ...] = Field(min_length=1)
    tensors: tuple[Tensor, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_layers(self) -> Workload:
        if self.device:
            hardware.device(self.device)
        if self.precision not in hardware.ACTIVATION_BYTES:
            raise ValueError(f"precision must be one of {list(hardware.ACTIVATION_BYTES)}, "
                             f"got {self.precision!r}")
        for t in self.tensors:
            if t.layer >= len(self.layers):
                raise ValueError(f"tensor {t.name!r} has layer {t.layer}, but there are only "
                                 f"{len(self.layers)} layers")
        return self

    @property
    def total_params(self) -> int:
        """Number of parameters (elements over all tensors)."""
        return sum(t.numel for t in self.tensors)

    @property
    def model_bytes(self) -> int:
        """Bytes of one full gradient in fp32 (the default precision's :data:`ITEMSIZE`)."""
        return ITEMSIZE * self.total_params

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> Workload:
        """Validate a profile mapping (the YAML format of the module docstring).

        Raises:
            ValueError: naming the source and the field that is wrong.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{source}: a workload profile must be a mapping, got "
                             f"{type(data).__name__}")
        keys = {"name", "batch_size", "gpu", "device", "matmul_fraction", "precision", "seq_len",
                "mixed_precision_speedup", "notes", "measured", "layers"}
        unknown = set(data) - keys
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {sorted(unknown)}; valid keys: "
                             f"{sorted(keys)}")
        raw_layers = data.get("layers")
        if not isinstance(raw_layers, list) or not raw_layers:
            raise ValueError(f"{source}: field 'layers' must be a non-empty list of layers")
        layers, tensors = [], []
        for i, raw in enumerate(raw_layers):
            where = f"{source}: layers[{i}]"
            if not isinstance(raw, dict):
                raise ValueError(f"{where}: must be a mapping with name, fwd_ms, bwd_ms, tensors")
            extra = set(raw) - {"name", "fwd_ms", "bwd_ms", "tensors"}
            if extra:
                raise ValueError(f"{where}: unknown key(s) {sorted(extra)}; valid keys: "
                                 "['bwd_ms', 'fwd_ms', 'name', 'tensors']")
            try:
                layers.append(Layer(name=raw.get("name", f"layer{i}"),
                                    fwd_s=_ms(raw, "fwd_ms", where), bwd_s=_ms(raw, "bwd_ms", where)))
                for j, t in enumerate(raw.get("tensors") or []):
                    if not isinstance(t, dict):
                        raise ValueError(f"{where}.tensors[{j}]: must be a mapping {{name, numel}}")
                    tensors.append(_tensor(t, i, f"{where}.tensors[{j}]"))
            except ValidationError as err:
                raise ValueError(f"{where}: {_explain(err)}") from None
        try:
            return cls(name=data.get("name", source), batch_size=data.get("batch_size", 0),
                       gpu=data.get("gpu", ""), device=data.get("device", ""),
                       matmul_fraction=data.get("matmul_fraction"),
                       precision=data.get("precision", "fp32"), seq_len=data.get("seq_len"),
                       mixed_precision_speedup=data.get("mixed_precision_speedup"),
                       notes=data.get("notes", ""),
                       measured=data.get("measured"), layers=tuple(layers), tensors=tuple(tensors))
        except ValidationError as err:
            raise ValueError(f"{source}: {_explain(err)}") from None

    def scaled(self, compute_scale: float) -> Workload:
        """Return a copy whose compute times are multiplied by ``compute_scale``."""
        if compute_scale == 1.0:
            return self
        layers = tuple(Layer(name=x.name, fwd_s=x.fwd_s * compute_scale,
                             bwd_s=x.bwd_s * compute_scale) for x in self.layers)
        return self.model_copy(update={"layers": layers})

    def recomputed(self, policy: bool | str = True) -> Workload:
        """Return a copy under activation checkpointing ``policy`` (the values of
        :attr:`ddpbench.contract.Schedule.activation_checkpointing`).

        ``True`` (full): every layer's backward also runs its forward again
        (torch/utils/checkpoint.py), so it takes ``fwd + bwd``. ``False``: ``self``.

        The selective policies follow torchtitan (torchtitan/distributed/
        activation_checkpoint.py at commit 1f029641, ``_apply_layer_sac`` and
        ``_apply_op_sac`` for ``selective_ac_option`` a frequency or ``"op"``), which wraps
        only the transformer blocks (the children of ``model.layers``): embedding, final
        norm and output layers are never recomputed. A block is the run of layers whose
        names share a prefix ending in a block index (``model.layers.K``,
        ``transformer.blocks.K``, ``transformer.h.K.attn``, ``encoder.layer.K.output``,
        ``encoder.layers.encoder_layer_K``); a profile without such names (a CNN, an LSTM)
        counts each of its layers as one block.

        ``"layer:N"``: torchtitan counts the blocks from 1 in forward order and checkpoints
        those whose count ``% N == 0`` (blocks ``N-1, 2N-1, ...`` from 0), so their layers
        take ``fwd + bwd``; ``"layer:1"`` checkpoints every block.

        ``"op"``: torchtitan's policy saves the outputs of the compute-intensive operators
        (matrix products, attention, ...) except every second ``mm``/``linear`` (the 2nd,
        4th, ... of each block's forward; the count restarts per block), which is
        recomputed with every operator outside the save list. A block layer's backward
        therefore takes ``fwd x ((1 - m) + m x r)`` more, where ``m`` is the profile's
        ``matmul_fraction`` and ``r`` the even-numbered linears' share of the layer's
        linear time, by weight size (:meth:`_even_linear_shares`). The profiles do not
        separate attention-score products from linear layers, so all of ``m`` counts as
        linear time.

        Raises:
            ValueError: for ``"op"`` on a profile without ``matmul_fraction``, or a policy
                that is not one of the accepted forms.
        """
        from ddpbench import contract

        policy = contract.check_activation_checkpointing(policy)
        if policy is False:
            return self
        if policy is True:
            extra = [x.fwd_s for x in self.layers]
        else:
            blocks = self.blocks()
            period = contract.checkpointing_period(policy)
            if period is not None:
                extra = [x.fwd_s if b is not None and (b + 1) % period == 0 else 0.0
                         for x, b in zip(self.layers, blocks)]
            else:
                if self.matmul_fraction is None:
                    raise ValueError(f"activation_checkpointing: workload {self.name!r} "
                                     f"records no matmul_fraction, which 'op' needs")
                m = self.matmul_fraction
                recomputed = self._even_linear_shares(blocks)
                extra = [x.fwd_s * ((1 - m) + m * r) if b is not None else 0.0
                         for x, b, r in zip(self.layers, blocks, recomputed)]
        layers = tuple(Layer(name=x.name, fwd_s=x.fwd_s, bwd_s=x.bwd_s + e) if e else x
                       for x, e in zip(self.layers, extra))
        return self.model_copy(update={"layers": layers})

    def _even_linear_shares(self, blocks: tuple[int | None, ...]) -> list[float]:
        """Return, per layer, the share of its linear layers' matrix-product time that
        torchtitan's ``"op"`` policy recomputes: its block's 2nd, 4th, ... linear in forward
        order (the count restarts per block), each linear's time taken as its weight's
        element count (a linear's FLOPs at a fixed token count). A linear is a
        two-dimensional weight, here a tensor named ``*.weight`` outside the norms and
        embeddings; a layer without one has no linear time to recompute (0); a profile
        without block names counts each layer as one block."""
        count: dict[int | None, int] = {}
        even = [0.0] * len(self.layers)
        total = [0.0] * len(self.layers)
        for t in self.tensors:  # creation order, which is forward order in the profiles
            low = t.name.lower()
            if not low.endswith(".weight") or any(k in low for k in _NOT_LINEAR):
                continue
            block = blocks[t.layer]
            count[block] = count.get(block, 0) + 1
            total[t.layer] += t.numel
            if count[block] % 2 == 0:
                even[t.layer] += t.numel
        return [e / n if n else 0.0 for e, n in zip(even, total)]

    def blocks(self) -> tuple[int | None, ...]:
        """Return, per layer, the 0-based index of the transformer block it belongs to (in
        forward order) or ``None`` outside every block; a profile none of whose layer
        names carries a block index counts each layer as a block of its own (the rule of
        :meth:`recomputed`)."""
        prefixes = [m.group(0) if (m := _BLOCK.search(x.name)) else None for x in self.layers]
        if all(p is None for p in prefixes):
            return tuple(range(len(self.layers)))
        order: dict[str, int] = {}
        for p in prefixes:
            if p is not None:
                order.setdefault(p, len(order))
        return tuple(None if p is None else order[p] for p in prefixes)

    def accumulated(self, micro_batches: int) -> Workload:
        """Return a copy for ``micro_batches`` per optimizer step that communicates once, after
        the last one: the GPU runs the first micro-batch's forward, the other micro-batches'
        backward and forward passes, then the last backward (``F1 B1 F2 ... Fk Bk``), so the
        ``k - 1`` extra forward and backward passes are added to the last layer's forward,
        where they fall between the forward that waits for fresh weights and the backward
        whose gradients are sent."""
        extra = (micro_batches - 1) * sum(x.fwd_s + x.bwd_s for x in self.layers)
        if extra <= 0:
            return self
        last = self.layers[-1]
        layers = (*self.layers[:-1], Layer(name=last.name, fwd_s=last.fwd_s + extra,
                                           bwd_s=last.bwd_s))
        return self.model_copy(update={"layers": layers})

    def emulated(self, rate: float, overhead_s: float) -> Workload:
        """Return a copy whose non-zero compute times ``t`` are ``t x rate + overhead_s``.

        The time a trainer's compute emulation takes on a calibrated machine (one sleep per
        layer and pass; :mod:`ddpbench.calibration.machine`).
        """
        def f(t: float) -> float:
            return t * rate + overhead_s if t > 0 else 0.0

        layers = tuple(Layer(name=x.name, fwd_s=f(x.fwd_s), bwd_s=f(x.bwd_s))
                       for x in self.layers)
        return self.model_copy(update={"layers": layers})

    def compute_factor(self, device: str | None, batch_size: int | None,
                       precision: str | None = None) -> float:
        """Return the factor on compute times for ``device`` at ``batch_size`` per worker,
        computing in ``precision``.

        ``None`` keeps the profile's own device, batch or precision. The rules and their
        limits: :func:`ddpbench.hardware.compute_factor` (device and batch, at the profile's
        precision), then :func:`ddpbench.hardware.precision_factor` on the point's device.
        Where the point's device lacks the profile's precision (a bf16 profile on a V100),
        the precision changes first, on the profile's device, and the device rule runs at
        the point's precision.

        Raises:
            ValueError: an unknown device or precision, a batch < 1, a device without the
                precision, or a profile that does not record its device and matmul
                fraction (so it cannot be rescaled).
        """
        same_precision = precision is None or precision == self.precision
        if device is None and (batch_size is None or batch_size == self.batch_size) \
                and same_precision:
            return 1.0
        if not self.device or self.matmul_fraction is None:
            raise ValueError(f"device/batch_size/precision: workload {self.name!r} does not "
                             "record the device and matmul_fraction its times were taken at, "
                             "so they cannot be rescaled; add both to its profile")
        ref = hardware.device(self.device)
        dev = hardware.device(device) if device is not None else ref
        batches = (self.batch_size, batch_size or self.batch_size)
        a = self.matmul_fraction
        if precision is not None and not same_precision \
                and dev.peak_tflops(self.precision) is None \
                and ref.peak_tflops(precision) is not None:
            first = hardware.precision_factor(a, ref, self.precision, precision)
            mm = a * _peak(ref, self.precision) / _peak(ref, precision)
            return first * hardware.compute_factor(mm / first, ref, dev, *batches, precision,
                                                   saturation=self.seq_len is None)
        factor = hardware.compute_factor(a, ref, dev, *batches, self.precision,
                                         saturation=self.seq_len is None)
        if same_precision or precision is None:
            return factor
        a = hardware.matmul_fraction_on(a, ref, dev, self.precision)
        return factor * hardware.precision_factor(a, dev, self.precision, precision)

    def resized(self, size_scale: float) -> Workload:
        """Return a copy whose tensors hold ``size_scale`` times the elements (rounded, >= 1).

        Real runs of a scaled-down profile and their simulated prediction use this same
        copy, so both move the same bytes.
        """
        if size_scale == 1.0:
            return self
        tensors = tuple(t.model_copy(update={"numel": max(1, int(round(t.numel * size_scale)))})
                        for t in self.tensors)
        return self.model_copy(update={"tensors": tensors})


def _tensor(raw: dict, layer: int, where: str) -> Tensor:
    """Build one tensor entry; ``bytes``, when given, must agree with numel and dtype."""
    fields = dict(raw)
    nbytes = fields.pop("bytes", None)
    t = Tensor(layer=layer, **fields)
    if nbytes is not None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"{where}: field 'bytes' must be an integer > 0, got {nbytes!r}")
        if nbytes % t.numel:
            raise ValueError(f"{where}: field 'bytes' ({nbytes}) is not a multiple of numel "
                             f"({t.numel})")
    if t.shape is not None and _prod(t.shape) != t.numel:
        raise ValueError(f"{where}: field 'shape' {list(t.shape)} holds {_prod(t.shape)} "
                         f"elements, but numel is {t.numel}")
    return t


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _peak(dev: hardware.Device, precision: str) -> float:
    peak = dev.peak_tflops(precision)
    assert peak is not None  # the caller checked
    return peak


def _ms(raw: dict, key: str, where: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{where}: field {key!r} must be a number >= 0 (milliseconds), "
                         f"got {value!r}")
    return float(value) / 1e3


def _explain(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "value"
        parts.append(f"field {loc!r}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(parts)


@functools.cache
def _builtin(name: str) -> Workload:
    path = PROFILE_DIR / f"{name}.yaml"
    return Workload.from_dict(safeyaml.load(path.read_text()), source=name)


def load_workload(name_or_path: str | Path | Workload) -> Workload:
    """Return a shipped workload by name or read a profile YAML file.

    Args:
        name_or_path: one of :data:`WORKLOADS`, a path to a YAML profile, or a Workload
            (returned unchanged).

    Raises:
        ValueError: unknown name, unreadable file or invalid profile (naming the field).
    """
    if isinstance(name_or_path, Workload):
        return name_or_path
    if not isinstance(name_or_path, (str, Path)):
        raise TypeError(f"workload: expected a name, a path or a Workload, got "
                        f"{type(name_or_path).__name__}")
    key = str(name_or_path)
    if key in WORKLOADS:
        return _builtin(key)
    path = Path(key)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        raise ValueError(f"workload: unknown workload {key!r}; available: {list(WORKLOADS)} "
                         "or the path of a profile YAML file")
    try:
        data = safeyaml.load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"workload: {path} is not valid YAML: {err}") from None
    return Workload.from_dict(data, source=str(path))
