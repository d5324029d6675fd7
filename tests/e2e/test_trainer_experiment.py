"""``ddpbench train`` and the ``accuracy`` experiment kind: configs, names, report, one real run."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import ddpbench
from ddpbench import nn
from ddpbench.data import ShardedLoader, load_dataset
from ddpbench.experiments import accuracy as acc
from ddpbench.experiments.accuracy.worker import make_config


def _spec(**kw):
    base = {"workers": 2, "steps": 10, "variants": [
        {"backends": ["mpi", "horovod"]},
        {"backends": ["horovod"], "compression": ["none", "fp16"], "predivide": [1, 4]},
        {"backends": ["collective"], "local_sgd_period": [2]},
    ]}
    return acc.Spec.model_validate({**base, **kw})


def test_expand_names_and_dedup():
    points = acc.expand(_spec())
    names = [acc.point_name(p) for p in points]
    assert names == ["mpi[]", "horovod[]", "horovod[predivide=4]", "horovod[compression=fp16]",
                     "horovod[compression=fp16,predivide=4]", "collective[local_sgd_period=2]"]
    assert all(p["mode"] == "real" for p in points)
    assert acc.run.setting_label(points[4]) == "fp16, f=4"
    assert acc.run.setting_label(points[5]) == "localSGD P=2"


def test_spec_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="extra"):
        _spec(epochs=3)
    with pytest.raises(ValueError, match="compression"):
        acc.Spec.model_validate({"variants": [{"backends": ["mpi"], "compression": ["int8"]}]})
    spec = _spec()
    assert acc.Spec.model_validate(spec.model_dump(mode="json")) == spec


def test_make_config_validates():
    with pytest.raises(ValueError, match="local SGD is a mode of the 'collective'"):
        make_config(backend="horovod", local_sgd_period=4)
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        make_config(backend="nope")
    with pytest.raises(ValueError, match="unknown model"):
        make_config(model="resnet")
    cfg = make_config(backend="collective", local_sgd_period=3)
    assert cfg["knobs"] == {"mode": "local_sgd", "local_sgd_period": 3}


def test_render_checks_targets(tmp_path):
    rows = []
    for point, backend, setting, a in [("mpi[]", "mpi", "fp32", 80.0),
                                       ("horovod[]", "horovod", "fp32", 80.05),
                                       ("horovod[compression=fp16]", "horovod", "fp16", 79.0)]:
        rows.append({"point": point, "backend": backend, "setting": setting, "status": "ok",
                     "final_test_acc": a, "replica_max_diff": 0.0, "step_time_ms": 1.0,
                     "curve_step": json.dumps([10, 20]), "curve_test_acc": json.dumps([50, a]),
                     "error": ""})
    paths = acc.render(pd.DataFrame(rows), tmp_path, _spec())
    text = (tmp_path / "report.md").read_text()
    assert "PASS: fp32 backends (mpi, horovod) span 0.05 points" in text
    assert "FAIL: horovod fp16 compression is -1.05 points" in text
    assert {p.name for p in paths} >= {"accuracy_fp32_backends.png", "accuracy_settings.png",
                                       "final_accuracy.png", "report.md"}


def _reference_accuracy(steps: int, batch: int) -> float:
    ds = load_dataset("synthetic")
    m = nn.create_model("mlp", seed=0)
    opt = nn.SGD(lr=0.1)
    loader = ShardedLoader(ds.x_train, ds.y_train, batch, seed=0)
    for step in range(steps):
        x, y = loader.batch(step)
        _, d = nn.softmax_cross_entropy(m.forward(x), y)
        m.backward(d)
        for p in m.parameters():
            opt.update(p.data, p.grad * np.float32(1 / batch), None)
    return 100 * nn.accuracy(m.forward(ds.x_test), ds.y_test)


def _train(tmp_path, *args):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench", "train", "-n", "2", "--steps", "30",
         "--batch-size", "16", "--eval-every", "10", "--lr-schedule", "constant",
         "--out", str(out), *args],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "final test accuracy" in proc.stdout
    return json.loads(out.read_text())


@pytest.mark.mpi
def test_train_command_matches_single_process_accuracy(tmp_path):
    """2 workers x batch 16 for 30 steps reach the same test accuracy as one process on the
    full batch of 32 (the parameters agree to ~1e-7, so no test prediction flips)."""
    res = _train(tmp_path, "--backend", "collective")
    assert res["final_test_acc"] == pytest.approx(_reference_accuracy(30, 32), abs=1e-9)
    assert res["replica_max_diff"] == 0.0
    assert res["curve"]["step"] == [10, 20, 30]


@pytest.mark.mpi
def test_train_command_update_on_kvstore_dedicated_server(tmp_path):
    if "kvstore" not in ddpbench.available():
        pytest.skip("backend 'kvstore' is not written yet")
    res = _train(tmp_path, "--backend", "kvstore", "--servers", "1", "--update-on-kvstore")
    assert res["final_test_acc"] == pytest.approx(_reference_accuracy(30, 32), abs=1e-9)
    assert res["replica_max_diff"] == 0.0
