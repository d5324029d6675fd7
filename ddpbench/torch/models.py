"""Small models for the accuracy experiments, importable as ``ddpbench.torch.models:NAME``.

The ``model:`` key of an accuracy experiment takes the same spec as ``ddpbench profile``
(``torchvision:NAME`` or ``package.module:factory``); these factories are models sized for
28x28 grey digits (``mnist5k``) that train in seconds on a CPU core.
"""

from __future__ import annotations

from torch import nn

__all__ = ["lenet", "mlp"]


def lenet(num_classes: int = 10, in_channels: int = 1) -> nn.Module:
    """Return a LeNet-5-style network for 28x28 images (two conv layers, two linear)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 5), nn.ReLU(), nn.MaxPool2d(2),   # 28 -> 24 -> 12
        nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),            # 12 -> 8 -> 4
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, num_classes),
    )


def mlp(num_classes: int = 10, in_features: int = 784) -> nn.Module:
    """Return a two-layer perceptron on flattened 28x28 images."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, 128), nn.ReLU(),
                         nn.Linear(128, num_classes))
