"""A small neural-network library for the accuracy experiments: layers, parameters, models.

Everything is written against an *array module* (``xp``): the module of the arrays flowing
through (NumPy, or CuPy on a GPU, picked by :func:`ddpbench.tensor_ops.array_module`), so
the same layers run on either. Parameters are initialised from NumPy generators on the host
and moved to the input's module, so a model starts from the same values on CPU and GPU.

Parameters may be *deferred*: a :class:`Dense` layer created without ``in_units`` learns
its input size at the first forward pass (Gluon's deferred initialisation). A parameter
calls its ``on_initialised`` hooks the moment it gets values, which is what
:func:`ddpbench.broadcast_parameters` uses to broadcast root's values as soon as they
exist, and its ``on_grad`` hooks the moment backward has produced its gradient, which is
what :class:`ddpbench.DistributedTrainer` uses to start communication while backward goes
on (the hook fires in layer order from the output back to the input).

Example:
    >>> model = nn.mlp(num_classes=10, hidden=(64,), seed=0)
    >>> logits = model.forward(x)                  # weights get their shapes here
    >>> loss, dlogits = nn.softmax_cross_entropy(logits, y)
    >>> model.backward(dlogits)                     # fills p.grad, fires on_grad hooks

The optimizer is :class:`ddpbench.SGD` (also reachable here as ``nn.SGD``): the same class
updates parameters locally and runs on the ``kvstore`` servers.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ddpbench.optim import SGD  # the one optimizer, re-exported: nn.SGD is ddpbench.SGD
from ddpbench.tensor_ops import array_module

__all__ = [
    "CNN",
    "MLP",
    "MODELS",
    "SGD",
    "Conv2D",
    "Dense",
    "Flatten",
    "Layer",
    "Parameter",
    "ReLU",
    "Sequential",
    "accuracy",
    "create_model",
    "mlp",
    "cnn",
    "softmax_cross_entropy",
]

Initializer = Callable[[np.random.Generator, tuple[int, ...], int], np.ndarray]


def he_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """Return N(0, 2/fan_in) values (He et al.), the usual start for ReLU networks."""
    return rng.normal(0.0, np.sqrt(2.0 / max(fan_in, 1)), size=shape)


def zeros(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """Return zeros (biases)."""
    return np.zeros(shape)


class Parameter:
    """A trainable array with its gradient, layer index and hooks.

    Attributes:
        name: unique within a model; the key it is communicated under.
        shape: the full shape, with ``0`` for dimensions not known until the first forward.
        data, grad: arrays once initialised, else None.
        layer: index of the layer that owns it (0 = nearest the input); trainers send
            gradients with priority ``-layer``.
        distributed: True for model-parallel parameters that differ per rank by design:
            never reduced nor broadcast.
        dtype: dtype of ``data`` and ``grad`` (float32 by default).
    """

    def __init__(
        self,
        name: str,
        shape: Sequence[int],
        *,
        init: Initializer = he_normal,
        layer: int = 0,
        distributed: bool = False,
        dtype: Any = np.float32,
        fan_in_axes: Sequence[int] = (),
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a parameter name must be a non-empty str, got {name!r}")
        if any((not isinstance(d, (int, np.integer))) or d < 0 for d in shape):
            raise ValueError(f"parameter {name!r}: shape {tuple(shape)} must hold ints >= 0 "
                             f"(0 = inferred at the first forward)")
        self.name = name
        self.init_key = name  # seeds the values; unlike the name, free of model prefixes
        self.shape: tuple[int, ...] = tuple(int(d) for d in shape)
        self.layer = int(layer)
        self.distributed = bool(distributed)
        self.dtype = np.dtype(dtype)
        self.data: Any = None
        self.grad: Any = None
        self._init = init
        self._fan_in_axes = tuple(fan_in_axes)
        self._init_hooks: list[Callable[[Parameter], None]] = []
        self._grad_hooks: list[Callable[[Parameter], None]] = []

    def __repr__(self) -> str:
        state = "deferred" if self.data is None else "initialised"
        return (f"Parameter({self.name!r}, shape={self.shape}, layer={self.layer}, "
                f"{state}{', distributed' if self.distributed else ''})")

    @property
    def initialised(self) -> bool:
        return self.data is not None

    @property
    def deferred(self) -> bool:
        """True while some dimension of the shape is still unknown."""
        return 0 in self.shape and self.data is None

    def on_initialised(self, fn: Callable[[Parameter], None]) -> None:
        """Call ``fn(self)`` right after this parameter gets its values.

        Hooks run once, in registration order, on the thread that initialises (the forward
        pass). Raises RuntimeError when the parameter is initialised already: act on it now.
        """
        if self.initialised:
            raise RuntimeError(f"parameter {self.name!r} is initialised already")
        self._init_hooks.append(fn)

    def on_grad(self, fn: Callable[[Parameter], None]) -> Callable[[], None]:
        """Call ``fn(self)`` every time backward has written ``grad``; return a remover."""
        self._grad_hooks.append(fn)

        def remove() -> None:
            if fn in self._grad_hooks:
                self._grad_hooks.remove(fn)

        return remove

    def initialise(self, shape: Sequence[int] | None = None, *, seed: int = 0, xp: Any = np
                   ) -> None:
        """Give the parameter values; fill deferred dimensions from ``shape``.

        Values come from a NumPy generator seeded with ``(seed, crc of init_key)`` (the name
        without a model prefix), so they do not depend on the order in which parameters are
        initialised.

        Raises:
            ValueError: ``shape`` contradicts a known dimension.
        """
        if self.initialised:
            return
        full = self.shape if shape is None else tuple(int(d) for d in shape)
        if len(full) != len(self.shape) or any(
            k and k != d for k, d in zip(self.shape, full)
        ):
            raise ValueError(f"parameter {self.name!r}: shape {full} does not fit the declared "
                             f"{self.shape} (0 = unknown)")
        if 0 in full:
            raise ValueError(f"parameter {self.name!r}: shape {full} still has unknown dims")
        self.shape = full
        import zlib

        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(self.init_key.encode())])
        fan_in = int(np.prod([full[a] for a in self._fan_in_axes])) if self._fan_in_axes else 1
        host = np.ascontiguousarray(self._init(rng, full, fan_in), dtype=self.dtype)
        self.data = xp.asarray(host)
        self.grad = xp.zeros_like(self.data)
        hooks, self._init_hooks = self._init_hooks, []
        for fn in hooks:
            fn(self)

    def set_data(self, value: Any) -> None:
        """Overwrite the values (shape and dtype must match) without running hooks."""
        if self.data is None:
            raise RuntimeError(f"parameter {self.name!r} is not initialised")
        self.data[...] = value

    def grad_ready(self) -> None:
        """Tell the hooks that ``grad`` now holds this backward pass's gradient."""
        for fn in list(self._grad_hooks):
            fn(self)


class Layer(abc.ABC):
    """Base of every layer: ``forward(x)``, ``backward(dout) -> dx``, ``params``."""

    kind = "layer"

    def __init__(self) -> None:
        self.params: list[Parameter] = []
        self.seed = 0

    def bind(self, prefix: str, layer: int, seed: int) -> None:
        """Name this layer's parameters ``prefix.<name>`` with layer index ``layer``."""
        self.seed = seed
        for p in self.params:
            p.name = p.init_key = f"{prefix}.{p.name}"
            p.layer = layer

    @abc.abstractmethod
    def forward(self, x: Any) -> Any:
        """Return the layer's output for ``x`` (keeping what backward needs)."""

    @abc.abstractmethod
    def backward(self, dout: Any) -> Any:
        """Fill the parameters' gradients from ``dout`` and return the input's gradient."""

    def _init_params(self, shapes: dict[str, tuple[int, ...]], xp: Any) -> None:
        for p in self.params:
            if not p.initialised:
                p.initialise(shapes.get(p.name.rsplit(".", 1)[-1]), seed=self.seed, xp=xp)
            elif array_module(p.data) is not xp:
                # Parameters made at construction live in NumPy; they follow the input to
                # the GPU (CuPy) at the first forward there, hooks and names unchanged.
                p.data = xp.asarray(p.data)
                p.grad = xp.zeros_like(p.data)


class Dense(Layer):
    """``y = x W^T + b`` with W of shape (units, in_units); in_units may be inferred.

    Args:
        units: output features.
        in_units: input features, or 0 to infer them at the first forward.
        use_bias: add a bias vector.
        distributed: mark the parameters model-parallel (never communicated).
    """

    kind = "dense"

    def __init__(self, units: int, in_units: int = 0, *, use_bias: bool = True,
                 distributed: bool = False) -> None:
        super().__init__()
        if units < 1 or in_units < 0:
            raise ValueError(f"Dense needs units >= 1 and in_units >= 0, got {units}, {in_units}")
        self.weight = Parameter("weight", (units, in_units), fan_in_axes=(1,),
                                distributed=distributed)
        self.params = [self.weight]
        self.bias = None
        if use_bias:
            self.bias = Parameter("bias", (units,), init=zeros, distributed=distributed)
            self.params.append(self.bias)
        self._x: Any = None

    def forward(self, x: Any) -> Any:
        xp = array_module(x)
        if x.ndim != 2:
            raise ValueError(f"Dense expects (batch, features) input, got shape {x.shape}")
        self._init_params({"weight": (self.weight.shape[0], x.shape[1])}, xp)
        if x.shape[1] != self.weight.shape[1]:
            raise ValueError(f"{self.weight.name}: input has {x.shape[1]} features, the layer "
                             f"was initialised for {self.weight.shape[1]}")
        self._x = x
        y = x @ self.weight.data.T
        if self.bias is not None:
            y += self.bias.data
        return y

    def backward(self, dout: Any) -> Any:
        x = self._x
        # The bias comes first: trainers see parameters become ready output-side first.
        if self.bias is not None:
            self.bias.grad[...] = dout.sum(axis=0)
            self.bias.grad_ready()
        self.weight.grad[...] = dout.T @ x
        self.weight.grad_ready()
        return dout @ self.weight.data


class ReLU(Layer):
    """max(x, 0)."""

    kind = "relu"

    def forward(self, x: Any) -> Any:
        self._mask = x > 0
        return x * self._mask

    def backward(self, dout: Any) -> Any:
        return dout * self._mask


class Flatten(Layer):
    """(N, ...) -> (N, prod(...))."""

    kind = "flatten"

    def forward(self, x: Any) -> Any:
        self._shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dout: Any) -> Any:
        return dout.reshape(self._shape)


class Conv2D(Layer):
    """2-D convolution of (N, C, H, W) input by im2col and one matrix product.

    Args:
        channels: output channels.
        kernel_size: square kernel side.
        stride, padding: as usual (zero padding on every side).
        in_channels: input channels, or 0 to infer them at the first forward.
    """

    kind = "conv"

    def __init__(self, channels: int, kernel_size: int, *, stride: int = 1, padding: int = 0,
                 in_channels: int = 0, use_bias: bool = True) -> None:
        super().__init__()
        if channels < 1 or kernel_size < 1 or stride < 1 or padding < 0 or in_channels < 0:
            raise ValueError(
                f"Conv2D needs channels, kernel_size, stride >= 1 and padding, in_channels >= 0; "
                f"got {channels}, {kernel_size}, {stride}, {padding}, {in_channels}"
            )
        self.k, self.stride, self.padding = kernel_size, stride, padding
        self.weight = Parameter("weight", (channels, in_channels, kernel_size, kernel_size),
                                fan_in_axes=(1, 2, 3))
        self.params = [self.weight]
        self.bias = None
        if use_bias:
            self.bias = Parameter("bias", (channels,), init=zeros)
            self.params.append(self.bias)

    def _cols(self, x: Any) -> tuple[Any, int, int]:
        xp = array_module(x)
        n, c, h, w = x.shape
        k, s, p = self.k, self.stride, self.padding
        oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        if oh < 1 or ow < 1:
            raise ValueError(f"{self.weight.name}: input {h}x{w} is smaller than the kernel {k}")
        xpad = xp.pad(x, ((0, 0), (0, 0), (p, p), (p, p))) if p else x
        cols = xp.empty((n, c, k, k, oh, ow), dtype=x.dtype)
        for i in range(k):
            for j in range(k):
                cols[:, :, i, j] = xpad[:, :, i:i + s * oh:s, j:j + s * ow:s]
        # rows: (n, oh, ow); columns: (c, i, j), matching the weight's layout
        return cols.transpose(0, 4, 5, 1, 2, 3).reshape(n * oh * ow, c * k * k), oh, ow

    def forward(self, x: Any) -> Any:
        xp = array_module(x)
        if x.ndim != 4:
            raise ValueError(f"Conv2D expects (N, C, H, W) input, got shape {x.shape}")
        f = self.weight.shape[0]
        self._init_params({"weight": (f, x.shape[1], self.k, self.k)}, xp)
        if x.shape[1] != self.weight.shape[1]:
            raise ValueError(f"{self.weight.name}: input has {x.shape[1]} channels, the layer "
                             f"was initialised for {self.weight.shape[1]}")
        cols, oh, ow = self._cols(x)
        self._x_shape, self._cols_cache, self._out = x.shape, cols, (oh, ow)
        y = cols @ self.weight.data.reshape(f, -1).T
        if self.bias is not None:
            y += self.bias.data
        return y.reshape(x.shape[0], oh, ow, f).transpose(0, 3, 1, 2)

    def backward(self, dout: Any) -> Any:
        xp = array_module(dout)
        n, c, h, w = self._x_shape
        oh, ow = self._out
        k, s, p = self.k, self.stride, self.padding
        f = self.weight.shape[0]
        d2 = dout.transpose(0, 2, 3, 1).reshape(n * oh * ow, f)
        if self.bias is not None:
            self.bias.grad[...] = d2.sum(axis=0)
            self.bias.grad_ready()
        self.weight.grad[...] = (d2.T @ self._cols_cache).reshape(self.weight.shape)
        self.weight.grad_ready()
        dcols = (d2 @ self.weight.data.reshape(f, -1)).reshape(n, oh, ow, c, k, k)
        dcols = dcols.transpose(0, 3, 4, 5, 1, 2)
        dx = xp.zeros((n, c, h + 2 * p, w + 2 * p), dtype=dout.dtype)
        for i in range(k):
            for j in range(k):
                dx[:, :, i:i + s * oh:s, j:j + s * ow:s] += dcols[:, :, i, j]
        return dx[:, :, p:p + h, p:p + w] if p else dx


class Sequential:
    """Layers applied in order; names parameters ``<kind><i>.<name>`` with layer indices.

    Args:
        layers: the layers, input first.
        seed: seeds every parameter's initial values (ranks seeded differently start
            differently until :func:`ddpbench.broadcast_parameters`).
        prefix: put before every parameter name, so that several models can share one
            store (parameter-server backends fix a name's size at its first use).
    """

    def __init__(self, layers: Iterable[Layer], *, seed: int = 0, prefix: str = "") -> None:
        self.layers = list(layers)
        self.seed = int(seed)
        counts: dict[str, int] = {}
        index = 0
        for layer in self.layers:
            if not layer.params:
                continue
            i = counts.get(layer.kind, 0)
            counts[layer.kind] = i + 1
            layer.bind(f"{layer.kind}{i}", index, self.seed)
            for p in layer.params:
                p.name = prefix + p.name
            index += 1
        # Shapes known now get values now; the others at the first forward (deferred).
        for p in self.parameters():
            if 0 not in p.shape:
                p.initialise(seed=self.seed)

    def parameters(self) -> list[Parameter]:
        """Return every parameter, input side first."""
        return [p for layer in self.layers for p in layer.params]

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer.forward(x)
        return x

    __call__ = forward

    def backward(self, dout: Any) -> Any:
        """Back-propagate ``dout``; each parameter's gradient hooks fire as it is produced."""
        for layer in reversed(self.layers):
            dout = layer.backward(dout)
        return dout


def softmax_cross_entropy(logits: Any, labels: Any) -> tuple[float, Any]:
    """Return the summed cross-entropy over the batch and its gradient w.r.t. ``logits``.

    The loss is a sum, not a mean, so gradients from shards add up to the full batch's;
    the trainer divides by the batch size in ``step(batch_size)`` (Gluon's convention).
    """
    xp = array_module(logits)
    z = logits - logits.max(axis=1, keepdims=True)
    e = xp.exp(z)
    s = e.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    rows = xp.arange(n)
    loss = float((xp.log(s[:, 0]) - z[rows, labels]).sum())
    grad = e / s
    grad[rows, labels] -= 1
    return loss, grad.astype(logits.dtype, copy=False)


def accuracy(logits: Any, labels: Any) -> float:
    """Return the fraction of rows whose largest logit is the label."""
    return float((logits.argmax(axis=1) == labels).mean())


def mlp(num_classes: int = 10, hidden: Sequence[int] = (64, 64), *, seed: int = 0,
        in_units: int = 0, prefix: str = "") -> Sequential:
    """Return an MLP whose first layer's input size is inferred at the first forward."""
    layers: list[Layer] = []
    for i, h in enumerate(hidden):
        layers += [Dense(h, in_units if i == 0 else 0), ReLU()]
    layers.append(Dense(num_classes))
    return Sequential(layers, seed=seed, prefix=prefix)


def cnn(num_classes: int = 10, channels: Sequence[int] = (8, 16), *, seed: int = 0,
        prefix: str = "") -> Sequential:
    """Return a small CNN for (N, C, 8, 8)-ish images: 3x3 convs (the second strided)."""
    layers: list[Layer] = []
    for i, c in enumerate(channels):
        layers += [Conv2D(c, 3, stride=1 if i == 0 else 2, padding=1), ReLU()]
    layers += [Flatten(), Dense(num_classes)]
    return Sequential(layers, seed=seed, prefix=prefix)


MLP, CNN = mlp, cnn
MODELS: dict[str, Callable[..., Sequential]] = {"mlp": mlp, "cnn": cnn}


def create_model(name: str, *, num_classes: int = 10, seed: int = 0, prefix: str = ""
                 ) -> Sequential:
    """Return the zoo model ``name`` (``mlp`` or ``cnn``).

    Raises:
        ValueError: unknown name (the valid ones are listed).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid models: {sorted(MODELS)}")
    return MODELS[name](num_classes=num_classes, seed=seed, prefix=prefix)
