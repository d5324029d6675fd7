"""The optimizer: one :class:`SGD`, run on the workers or on the parameter servers.

MXNet uses one optimizer class for both places (Gluon's ``Trainer`` updates locally or
hands the same object to ``kv.set_optimizer``), and so does ddpbench: the
:class:`~ddpbench.DistributedTrainer` updates local parameters with it, and the ``kvstore``
servers run it on their copy of the weights after ``kv.set_optimizer(ddpbench.SGD(...))``.
It holds only plain numbers, so it crosses the wire as a dict and no code does.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ddpbench.tensor_ops import array_module

__all__ = ["SGD"]


class SGD(BaseModel):
    """Stochastic gradient descent with momentum and weight decay, as MXNet computes it.

    One step on weights ``w`` with gradient ``g`` (all in ``w``'s dtype), as MXNet's
    ``sgd_update``/``sgd_mom_update`` (src/operator/optimizer_op-inl.h)::

        g = rescale_grad * g, clipped to [-clip_gradient, clip_gradient] if set
        without momentum: w = w - lr * (g + wd * w)
        with momentum:    mom = momentum * mom - lr * (g + wd * w);  w = w + mom

    For a constant learning rate this is the same sequence of weights as the textbook form
    (``v = momentum * v + g; w -= lr * v``).

    Example:
        >>> opt = ddpbench.SGD(lr=0.1, momentum=0.9)
        >>> state = opt.create_state(w)
        >>> opt.update(w, grad, state)         # locally, in place
        >>> kv.set_optimizer(opt)              # or on the kvstore servers
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    lr: float = Field(0.01, gt=0, allow_inf_nan=False, description="learning rate")
    momentum: float = Field(0.0, ge=0, allow_inf_nan=False)
    wd: float = Field(0.0, ge=0, allow_inf_nan=False, description="weight decay")
    rescale_grad: float = Field(1.0, allow_inf_nan=False,
                                description="gradients are multiplied by this first")
    clip_gradient: float | None = Field(None, gt=0, allow_inf_nan=False)

    def create_state(self, weight: Any) -> Any:
        """Return the per-parameter state: a zero momentum buffer, or None without momentum."""
        return array_module(weight).zeros_like(weight) if self.momentum else None

    def update(self, weight: Any, grad: Any, state: Any) -> None:
        """Apply one step to ``weight`` in place; ``state`` is from :meth:`create_state`."""
        t = weight.dtype.type
        g = grad * t(self.rescale_grad) if self.rescale_grad != 1.0 else grad
        if self.clip_gradient is not None:
            g = array_module(weight).clip(g, -t(self.clip_gradient), t(self.clip_gradient))
        if self.wd:
            g = g + t(self.wd) * weight
        if state is None:
            weight -= t(self.lr) * g
            return
        state *= t(self.momentum)
        state -= t(self.lr) * g
        weight += state

    def __call__(self, weight: Any, grad: Any, state: Any) -> None:
        self.update(weight, grad, state)
