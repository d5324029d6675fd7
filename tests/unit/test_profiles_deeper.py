"""The profiles derived from others: ResNet-152 from ResNet-50's measured blocks, AlexNet
from its layer definitions at the ResNet-50 profile's speeds (closed forms)."""

from __future__ import annotations

import pytest

from ddpbench.simulator import load_workload
from ddpbench.simulator import make_profiles as mp


def _block_ms(prof: dict, prefix: str) -> float:
    return sum(x["fwd_ms"] + x["bwd_ms"] for x in prof["layers"] if x["name"].startswith(prefix))


def _total_ms(prof: dict) -> float:
    return sum(x["fwd_ms"] + x["bwd_ms"] for x in prof["layers"])


def test_resnet152_is_resnet50_with_the_extra_blocks_at_their_stages_last_times():
    r50, r152 = mp.resnet50(), mp.resnet152()
    total50, total152 = _total_ms(r50), _total_ms(r152)
    extra = 4 * _block_ms(r50, "layer2.3.") + 30 * _block_ms(r50, "layer3.5.")
    assert total152 == pytest.approx(total50 + extra)
    for b in range(4, 8):
        assert _block_ms(r152, f"layer2.{b}.") == pytest.approx(_block_ms(r50, "layer2.3."))
    for b in range(6, 36):
        assert _block_ms(r152, f"layer3.{b}.") == pytest.approx(_block_ms(r50, "layer3.5."))
    # torchvision's order: layer2's blocks, then layer3's, then layer4
    names = [x["name"] for x in r152["layers"]]
    assert names.index("layer2.7.conv1") < names.index("layer3.0.conv1")
    assert names.index("layer3.35.conv1") < names.index("layer4.0.conv1")
    assert r152["matmul_fraction"] == r50["matmul_fraction"]
    assert r152["device"] == r50["device"]
    assert load_workload("resnet152").total_params == 60_192_808  # torchvision resnet152


def test_resnet101_is_unchanged_by_the_shared_rule():
    r50, r101 = mp.resnet50(), mp.resnet101()
    assert _total_ms(r101) == pytest.approx(_total_ms(r50) + 17 * _block_ms(r50, "layer3.5."))


def test_alexnet_times_are_its_flops_at_the_profiles_speeds():
    prof = mp.alexnet()
    b = prof["batch_size"]
    conv1 = next(x for x in prof["layers"] if x["name"] == "features.0")
    # 64 filters of 3x11x11 over a 55x55 output, forward 2 FLOPs per multiply-add; its ReLU
    # reads and writes the output once in fp32
    mm = 2 * b * 55 * 55 * 3 * 64 * 11 * 11
    ew = 2 * 4 * b * 64 * 55 * 55 / mp.EW_BPS
    assert conv1["fwd_ms"] == pytest.approx(round((mm / mp.FLOPS + ew) * 1e3, 4))
    assert conv1["bwd_ms"] == pytest.approx(
        round((2 * mm / mp.FLOPS + mp.EW_BWD_RATIO * ew) * 1e3, 4))
    fc6 = next(x for x in prof["layers"] if x["name"] == "classifier.1")
    assert [t["numel"] for t in fc6["tensors"]] == [9216 * 4096, 4096]
    # the fully connected layers hold 96% of the parameters
    fc = sum(t["numel"] for x in prof["layers"] if x["name"].startswith("classifier")
             for t in x["tensors"])
    assert fc == 9216 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 1000 + 1000 == 58_631_144
    assert load_workload("alexnet").total_params == 61_100_840  # torchvision alexnet
