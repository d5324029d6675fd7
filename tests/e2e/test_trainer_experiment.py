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
    with pytest.raises(ValueError, match="update_on_kvstore is for the NumPy trainer"):
        make_config(model="ddpbench.torch.models:mlp", backend="kvstore",
                    update_on_kvstore=True, lr_schedule="constant")
    cfg = make_config(backend="collective", local_sgd_period=3)
    assert cfg["knobs"] == {"mode": "local_sgd", "local_sgd_period": 3}


@pytest.mark.parametrize("kw, words", [
    ({"lr": -1.0}, "lr must be a finite number > 0, got -1.0"),
    ({"lr": float("nan")}, "lr must be a finite number > 0, got nan"),
    ({"momentum": -0.5}, "momentum must be a finite number >= 0"),
    ({"predivide": 0.0}, "predivide must be a finite number > 0, got 0.0"),
    ({"backend": "kvstore", "servers": "abc"},
     "servers must be a number of server ranks or 'colocated', got 'abc'"),
])
def test_make_config_refuses_a_bad_number_before_any_rank_starts(kw, words):
    # (the workers' optimizer or trainer refused these only once the job had started)
    with pytest.raises(ValueError) as err:
        make_config(**kw)
    assert words in str(err.value)


def test_render_gives_mean_spread_and_tells_differences_from_noise(tmp_path):
    """Three seeds per point: mean, sample std, min..max; a difference beyond two standard
    errors 'differs', one within them is 'within noise'; the target_acc check."""
    rows = []
    for point, backend, setting, accs in [
            ("mpi[]", "mpi", "fp32", [96.0, 96.2, 96.4]),
            ("horovod[]", "horovod", "fp32", [96.1, 96.3, 96.5]),
            ("horovod[compression=fp16]", "horovod", "fp16", [96.0, 96.4, 96.2]),
            ("horovod[predivide=16]", "horovod", "f=16", [90.0, 90.2, 90.4])]:
        for rep, a in enumerate(accs):
            rows.append({"point": point, "backend": backend, "setting": setting,
                         "status": "ok", "repetition": rep, "final_test_acc": a,
                         "replica_max_diff": 0.0, "step_time_ms": 1.0,
                         "curve_step": json.dumps([10, 20]),
                         "curve_test_acc": json.dumps([50, a]),
                         "curve_test_loss": json.dumps([1.0, 0.1]), "error": ""})
    spec = _spec(target_acc=95, repetitions=3)
    paths = acc.render(pd.DataFrame(rows), tmp_path, spec)
    text = (tmp_path / "report.md").read_text()
    assert "| mpi | fp32 | 3 | 96.2 | 0.2 | 96.00..96.40 |" in text
    # fp16 against horovod fp32: -0.10 +- sqrt(0.04/3 + 0.04/3) = 0.16 -> within noise.
    assert "horovod fp16: -0.10 +- 0.16 points from horovod fp32 (within noise)" in text
    assert "horovod f=16: -6.10 +- 0.16 points from horovod fp32 (differs)" in text
    assert "PASS: fp32 reaches >= 95% on every backend (lowest mean 96.20% on mpi" in text
    assert {p.name for p in paths} >= {"accuracy_fp32_backends.png", "accuracy_settings.png",
                                       "final_accuracy.png", "report.md"}


def test_spec_takes_torch_models_and_datasets_and_names_bad_ones(tmp_path):
    spec = _spec(model="ddpbench.torch.models:lenet", dataset="mnist5k")
    assert spec.model == "ddpbench.torch.models:lenet"
    with pytest.raises(ValueError, match="model"):
        _spec(model="resnet")
    with pytest.raises(ValueError, match="dataset"):
        _spec(dataset="cifar")
    from ddpbench.experiments.schema import load_experiment

    bad = tmp_path / "x.yaml"
    bad.write_text("name: x\nkind: accuracy\nmodel: ddpbench.torch.models:nope\n"
                   "variants:\n  - backends: [mpi]\n")
    with pytest.raises(ValueError, match=r"x.yaml:3: field 'model': .*nope"):
        load_experiment(bad)


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


@pytest.mark.mpi
def test_torch_model_trains_on_mnist5k_through_ddpbench_torch():
    """A real 2-worker job of the accuracy kind's torch path: it learns (well above the 10%
    of chance after 60 steps) and the replicas end identical."""
    from ddpbench.experiments.accuracy.worker import run_training

    cfg = make_config(model="ddpbench.torch.models:lenet", dataset="mnist5k",
                      backend="horovod", workers=2, steps=60, batch_size=32, lr=0.1,
                      momentum=0.9, eval_every=30)
    res = run_training(cfg, timeout=240)
    assert res["framework"] == "torch" and res["parameters"] == 46_730
    assert res["curve"]["step"] == [30, 60]
    assert res["final_test_acc"] > 60.0
    assert res["replica_max_diff"] == 0.0


@pytest.mark.parametrize("out, words", [("no/such/folder/r.json", "does not exist"),
                                        (".", "is a folder")])
def test_train_refuses_an_output_it_could_not_write_before_training(tmp_path, out, words):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ddpbench", "train", "--out", out],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert "# ddpbench train:" not in proc.stderr  # no rank was started
