"""ddpbench profile: the profiler's core on small models, its CLI, and torchvision's tensor lists.

Torch comes with the dev extra that CI installs; without it only the loader and error tests
run, and the rest are reported as skipped (never silently passing).
"""

import json
import sys
import textwrap

import pytest
import yaml

from ddpbench.cli import main as cli_main
from ddpbench.simulator import Workload, load_workload

TINY = textwrap.dedent("""
    import torch
    from torch import nn


    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.skip = nn.Conv2d(3, 4, 1, bias=False)
            self.head = nn.Linear(4 * 6 * 6, 5)

        def forward(self, x):
            y = torch.relu(self.bn(self.conv(x))) + self.skip(x)
            return self.head(torch.flatten(y, 1))


    def residual():
        return Residual()


    def not_a_module():
        return 42
""")


@pytest.fixture
def tiny_module(tmp_path, monkeypatch):
    (tmp_path / "ddpb_tiny_models.py").write_text(TINY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "ddpb_tiny_models"
    sys.modules.pop("ddpb_tiny_models", None)


def test_profile_small_model_records_every_tensor(tiny_module):
    torch = pytest.importorskip("torch")
    from ddpbench import profiling

    data = profiling.profile(f"{tiny_module}:residual", batch_size=3, input_shape=(3, 6, 6),
                             warmup=1, repeats=3)
    wl = Workload.from_dict(data, source="tiny")
    model = profiling.build_model(f"{tiny_module}:residual")[0]
    expected = [(n, p.numel()) for n, p in model.named_parameters()]
    assert [(t.name, t.numel) for t in wl.tensors] == expected
    assert [x.name for x in wl.layers] == ["conv", "bn", "skip", "head"]
    raw = {t["name"]: t for layer in data["layers"] for t in layer["tensors"]}
    for name, p in model.named_parameters():
        assert raw[name]["shape"] == list(p.shape)
        assert raw[name]["dtype"] == "float32"
        assert raw[name]["bytes"] == 4 * p.numel()
        assert raw[name]["ready_ms"] >= 0
    # Backward runs the head first: its weight's gradient is complete before the first conv's.
    assert raw["head.weight"]["ready_ms"] < raw["conv.weight"]["ready_ms"]
    assert all(x.fwd_s >= 0 and x.bwd_s >= 0 for x in wl.layers)
    m = data["measured"]
    assert m["torch"] == torch.__version__ and m["repeats"] == 3 and m["batch_size"] == 3
    assert m["input_shape"] == [3, 6, 6] and m["device"] == "cpu" and data["device"] == "cpu"
    assert data["batch_size"] == 3 and 0 < data["matmul_fraction"] <= 1
    assert m["step_ms_min"] <= m["step_ms"] <= m["step_ms_max"]


def test_layer_times_rebuild_the_measured_step():
    """Forward and backward times of one hooked step add up to its stamps exactly."""
    pytest.importorskip("torch")
    from torch import nn

    from ddpbench.profiling import measure

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    m = measure(model, "mlp", batch_size=4, input_shape=(8,), warmup=0, repeats=1)
    assert [x[0] for x in m.layers] == ["0", "2"]
    assert sum(m.fwd_s) + sum(m.bwd_s) == pytest.approx(m.hooked_s[0], rel=1e-9)
    # The last layer's backward time is the wait for its own gradients.
    assert m.bwd_s[1] == pytest.approx(max(m.ready_s[2:]), rel=1e-9)


def test_cli_profile_writes_a_workload_that_simulate_accepts(tiny_module, tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "tiny.yaml"
    rc = cli_main(["profile", f"{tiny_module}:residual", "-B", "2", "--input-shape", "3,6,6",
                   "--malloc", "system", "--repeats", "2", "--warmup", "1", "-o", str(out),
                   "--compare", "resnet50"])
    assert rc == 0
    text = capsys.readouterr()
    assert "step 1/2" in text.err and "wrote" in text.out
    assert "tensor list against resnet50: differs, 7 tensors against 161" in text.out
    wl = load_workload(str(out))
    assert wl.total_params == 3 * 4 * 9 + 4 + 4 + 4 + 3 * 4 + 144 * 5 + 5
    measured = yaml.safe_load(out.read_text())["measured"]
    assert measured["tool"] == "ddpbench profile" and measured["malloc"] == "system"
    assert cli_main(["simulate", "--workload", str(out), "-b", "horovod", "-n", "2",
                     "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["workload"] == str(out)
    # Two workers exchange every gradient once: compute plus communication is at least compute.
    compute = sum(x.fwd_s + x.bwd_s for x in wl.layers)
    assert result["iteration_time_s"] >= compute


def test_cli_profile_keeps_freed_memory_by_default(tiny_module, tmp_path):
    """The default --malloc keep reaches glibc and is recorded (in a process of its own)."""
    pytest.importorskip("torch")
    import os
    import subprocess

    out = tmp_path / "tiny.yaml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    proc = subprocess.run(
        [sys.executable, "-m", "ddpbench.cli", "profile", f"{tiny_module}:residual", "-B", "2",
         "--input-shape", "3,6,6", "--repeats", "1", "--warmup", "0", "-o", str(out)],
        capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    expected = "keep" if sys.platform.startswith("linux") else "system (mallopt unavailable)"
    assert yaml.safe_load(out.read_text())["measured"]["malloc"] == expected


@pytest.mark.parametrize("spec, message", [
    ("torchvision:resnet5", "unknown torchvision model 'resnet5'"),
    ("resnet50", "expected torchvision:NAME"),
    ("no_such_pkg_xyz.mod:make", "cannot import module 'no_such_pkg_xyz.mod'"),
    ("{tiny}:missing", "has no callable 'missing'"),
    ("{tiny}:not_a_module", "returned int, not a torch.nn.Module"),
])
def test_cli_profile_bad_model(spec, message, tiny_module, tmp_path, capsys):
    pytest.importorskip("torch")
    rc = cli_main(["profile", spec.format(tiny=tiny_module), "-B", "2", "--malloc", "system",
                   "-o", str(tmp_path / "x.yaml")])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_cli_profile_input_shape_that_does_not_fit(tiny_module, tmp_path, capsys):
    pytest.importorskip("torch")
    rc = cli_main(["profile", f"{tiny_module}:residual", "-B", "2", "--input-shape", "3,7,7",
                   "--malloc", "system", "-o", str(tmp_path / "x.yaml")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "input shape [3, 7, 7] (batch 2) does not fit model 'residual'" in err
    assert "--input-shape" in err


def test_missing_torch_says_how_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    rc = cli_main(["profile", "torchvision:resnet50", "-B", "2", "-o", str(tmp_path / "x.yaml")])
    assert rc == 2
    assert "pip install 'ddpbench[torch]'" in capsys.readouterr().err


@pytest.mark.parametrize("name, count, params", [
    ("resnet50", 161, 25_557_032), ("vgg19", 38, 143_667_240), ("vgg16", 32, 138_357_544),
    ("resnet101", 314, 44_549_160), ("inception_v3", 292, 27_161_264),
    ("resnet152", 467, 60_192_808), ("alexnet", 16, 61_100_840),
])
def test_shipped_profiles_list_torchvisions_tensors(name, count, params):
    """The shipped profiles of torchvision models list its parameters exactly, in order."""
    pytest.importorskip("torchvision")
    from ddpbench.profiling import build_model

    model = build_model(f"torchvision:{name}")[0]
    tensors = [(n, p.numel()) for n, p in model.named_parameters()]
    assert len(tensors) == count and sum(n for _, n in tensors) == params
    assert [(t.name, t.numel) for t in load_workload(name).tensors] == tensors


def test_profile_fields_are_checked():
    base = {"name": "w", "batch_size": 2, "layers": [{"name": "fc", "fwd_ms": 1, "bwd_ms": 2,
            "tensors": [{"name": "fc.weight", "numel": 6, "shape": [2, 3], "dtype": "float32",
                         "bytes": 24, "ready_ms": 0.5}]}], "measured": {"repeats": 3}}
    wl = Workload.from_dict(base)
    assert wl.tensors[0].shape == (2, 3) and wl.tensors[0].ready_ms == 0.5
    assert wl.measured == {"repeats": 3}
    bad = yaml.safe_load(yaml.safe_dump(base))
    bad["layers"][0]["tensors"][0]["shape"] = [2, 2]
    with pytest.raises(ValueError, match=r"layers\[0\].tensors\[0\]: field 'shape' \[2, 2\]"):
        Workload.from_dict(bad)
    bad["layers"][0]["tensors"][0].update(shape=[2, 3], bytes=25)
    with pytest.raises(ValueError, match="'bytes' \\(25\\) is not a multiple of numel"):
        Workload.from_dict(bad)


def test_experiment_names_a_profile_beside_it(tmp_path):
    """A workload path in an experiment file is relative to that file, wherever ddpbench runs."""
    from ddpbench.experiments.schema import parse_experiment
    from ddpbench.experiments.throughput.points import expand

    folder = tmp_path / "exp"
    (folder / "profiles").mkdir(parents=True)
    profile = {"name": "mine", "batch_size": 2, "layers": [
        {"name": "fc", "fwd_ms": 1.0, "bwd_ms": 2.0, "tensors": [{"name": "fc.weight",
                                                                   "numel": 1000}]}]}
    (folder / "profiles" / "mine.yaml").write_text(yaml.safe_dump(profile))
    text = ("name: mine\nmode: simulate\nworkloads: [profiles/mine.yaml]\nworkers: 2\n"
            "bandwidth_gbps: 10\nbackends: [horovod]\n")
    (folder / "e.yaml").write_text(text)
    exp = parse_experiment(text, folder / "e.yaml")
    (point,) = expand(exp.spec)
    assert load_workload(point["workload"]).total_params == 1000
