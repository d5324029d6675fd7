"""Build the model that ``ddpbench profile`` measures, and its input.

``torchvision:NAME`` builds a torchvision classification model without weights (nothing is
downloaded); ``package.module:factory`` calls ``factory()`` from an importable module and
expects a ``torch.nn.Module``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DEFAULT_INPUT", "build_model", "default_input_shape", "import_torch"]

# Torchvision models whose input is not 3x224x224 images.
DEFAULT_INPUT: dict[str, tuple[int, ...]] = {"inception_v3": (3, 299, 299)}


def import_torch() -> Any:
    """Return the ``torch`` module, or raise a ValueError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise ValueError("profiling needs PyTorch, which is not installed: "
                         "pip install 'ddpbench[torch]'") from None
    return torch


def build_model(spec: str) -> tuple[Any, str]:
    """Return ``(module, name)`` for ``torchvision:NAME`` or ``package.module:factory``.

    Raises:
        ValueError: a malformed spec, an unknown torchvision model, a module or factory that
            cannot be imported, or a factory that does not return a ``torch.nn.Module``.
    """
    torch = import_torch()
    if ":" not in spec:
        raise ValueError(f"model {spec!r}: expected torchvision:NAME (e.g. torchvision:resnet50) "
                         "or package.module:factory")
    where, name = spec.split(":", 1)
    if not where or not name:
        raise ValueError(f"model {spec!r}: expected torchvision:NAME or package.module:factory")
    if where == "torchvision":
        try:
            import torchvision
        except ImportError:
            raise ValueError("torchvision models need torchvision, which is not installed: "
                             "pip install 'ddpbench[torch]'") from None
        known = sorted(torchvision.models.list_models(module=torchvision.models))
        if name not in known:
            raise ValueError(f"model {spec!r}: unknown torchvision model {name!r}; torchvision "
                             f"{torchvision.__version__} has: {', '.join(known)}")
        kwargs: dict[str, Any] = {"weights": None}
        if name == "inception_v3":
            kwargs["init_weights"] = False  # scipy-based init is slow and changes no shape
        return torchvision.models.get_model(name, **kwargs), name
    try:
        module = importlib.import_module(where)
    except ImportError as err:
        raise ValueError(f"model {spec!r}: cannot import module {where!r}: {err}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"model {spec!r}: module {where!r} has no callable {name!r}")
    model = factory()
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model {spec!r}: {name}() returned {type(model).__name__}, "
                         "not a torch.nn.Module")
    return model, name


def default_input_shape(name: str) -> tuple[int, ...]:
    """Return the per-sample input shape of torchvision model ``name`` (C, H, W)."""
    return DEFAULT_INPUT.get(name, (3, 224, 224))
