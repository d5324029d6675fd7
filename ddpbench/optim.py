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
    """Stochastic gradient descent with momentum and weight decay, as MXNet 1.x computes it.

    One step on weights ``w`` with gradient ``g``, every operation in ``w``'s dtype and in
    the order of MXNet's ``SGDKernel``/``SGDMomKernel`` (src/operator/optimizer_op-inl.h)::

        without momentum: w = (1 - lr*wd) * w - (lr*rescale_grad) * g
        with momentum:    mom = momentum*mom - (lr*wd) * w - (lr*rescale_grad) * g
                          w = w + mom

    With ``clip_gradient`` the gradient term is ``lr * clip(rescale_grad*g, -c, c)``. The
    products of scalars (``lr*wd``, ``lr*rescale_grad``) are rounded to the dtype first, as
    the kernel's ``DType`` arithmetic does, so float32 results equal MXNet's bit for bit (on
    a build without fused multiply-add). On parameter servers ``rescale_grad`` multiplies
    the summed gradient of all workers (the servers' updater gets the merged array).

    For a constant learning rate this is the same sequence of weights as the textbook form
    (``v = momentum * v + g; w -= lr * v``), up to rounding.

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
        lr, wd, rescale = t(self.lr), t(self.wd), t(self.rescale_grad)
        if self.clip_gradient is not None:
            c = t(self.clip_gradient)
            step = lr * array_module(weight).clip(rescale * grad, -c, c)
        else:
            step = (lr * rescale) * grad
        if state is None:
            weight[...] = (t(1) - lr * wd) * weight - step
            return
        state[...] = t(self.momentum) * state - (lr * wd) * weight - step
        weight += state

    def __call__(self, weight: Any, grad: Any, state: Any) -> None:
        self.update(weight, grad, state)
