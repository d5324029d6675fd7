"""Machine profiles: parsing with named errors, the contention law, and how a simulated
point uses a profile (closed forms of the simulator's ring on a calibrated machine)."""

import copy
import math
import sys
import textwrap

import pytest
import yaml
from machines import BASE

from ddpbench import simulator
from ddpbench.calibration import machine as M
from ddpbench.calibration.run import SYNTHETIC, synthetic_profile


def machine(**changes):
    data = copy.deepcopy(BASE)
    data.update(changes)
    return M.parse_machine(data, "m.yaml")


@pytest.mark.parametrize(("change", "message"), [
    ({"drop": "latency_us"}, "m.yaml: missing field 'latency_us'"),
    ({"set": ("latency_us", -1.0)}, "field 'latency_us': Input should be greater than or equal to 0"),
    ({"set": ("cores", 0)}, "field 'cores'"),
    ({"set": ("speed", 3)}, "m.yaml: unknown field 'speed'"),
    ({"set": ("kind", "other")}, "field 'kind' must be 'ddpbench-machine'"),
    ({"backend": ("mpi", "per_message_us", -5.0)}, "field 'backends.mpi.per_message_us'"),
    ({"backend": ("mpi", "gain", 2.0)}, "unknown field 'backends.mpi.gain'"),
    ({"set": ("backends", {"gloo": {"per_message_us": 1.0, "bandwidth_gbps": 1.0}})},
     "unknown backend(s) ['gloo']"),
    ({"set": ("ring_step_us", {"blocking": {1: 3.0}})}, "process counts >= 2"),
    ({"set": ("handoff_us", {2: -1.0})}, "field 'handoff_us': Value error, handoff: expected"),
    ({"set": ("handoff_us", {})}, "field 'handoff_us': Value error, handoff: expected"),
    ({"set": ("bind", "socket")}, "field 'bind': Input should be 'none' or 'core'"),
])
def test_bad_profile_names_the_field(change, message):
    data = copy.deepcopy(BASE)
    if "drop" in change:
        del data[change["drop"]]
    if "set" in change:
        key, value = change["set"]
        data[key] = value
    if "backend" in change:
        name, key, value = change["backend"]
        data["backends"][name][key] = value
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        M.parse_machine(data, "m.yaml")


def test_load_reads_yaml_safely_and_names_bad_files(tmp_path):
    path = tmp_path / "m.yaml"
    machine().save(path)
    assert M.load_machine(path) == machine()
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    with pytest.raises(ValueError, match="is not valid YAML"):
        M.load_machine(bad)
    code = tmp_path / "code.yaml"
    code.write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        M.load_machine(code)
    with pytest.raises(ValueError, match="cannot read machine profile"):
        M.load_machine(tmp_path / "missing.yaml")


def test_a_backend_the_profile_lacks_is_a_clear_error():
    with pytest.raises(ValueError, match=r"no calibration for backend 'p3' \(it has: "
                                         r"\['kvstore', 'mpi'\]\)"):
        simulator.simulate("resnet50", "p3", workers=2, bandwidth_gbps=1, machine=machine())


def test_contention_law_is_flat_within_the_cores_then_a_line_in_processes_per_core():
    m = machine()
    # blocking on 2 cores: s0 = 30 (P <= 2); P = 3 and 4 both put 2 processes on a core
    # (x = ceil(P / 2) - 1 = 1): k = sum(x y) / sum(x^2) over (1, 40), (1, 80) = 60.
    assert m.step_us("blocking", 2) == 30.0
    assert m.step_us("blocking", 3) == m.step_us("blocking", 4) == pytest.approx(30 + 60)
    assert m.step_us("blocking", 5) == pytest.approx(30 + 60 * 2)
    # polled: (1, 100), (2, 200) -> k = (100 + 400) / 5 = 100; P = 8 is x = 3.
    assert m.step_us("polled", 8) == pytest.approx(30 + 100 * 3)
    assert m.contention("blocking", 3, calibration_processes=2) == pytest.approx(90 / 30)
    assert m.contention("blocking", 2, calibration_processes=2) == 1.0
    assert m.contention("polled", 2, calibration_processes=2) == 1.0
    assert m.contention("polled", 7, calibration_processes=8) == 1.0  # same sharing


def test_adjust_at_the_calibration_and_beyond():
    m = machine()
    same = M.adjust(m, "mpi", workers=2, servers=0, paced=False, bandwidth_gbps=1.0,
                    latency_us=20.0)
    assert same == {"bandwidth_gbps": 16.0, "latency_us": 2.0, "per_message_us": 15.0,
                    "sum_gbps": 80.0, "compute_rate": 1.5, "compute_overhead_s": 70e-6 * 1.5}
    f = 90 / 30  # blocking at 3 processes against 2
    more = M.adjust(m, "mpi", workers=3, servers=0, paced=False, bandwidth_gbps=1.0,
                    latency_us=20.0)
    # One call per tensor: its cost (2 steps of 15 us at 2 workers) stretched by f, spread
    # over the 4 steps of a ring of 3.
    assert more["per_message_us"] == pytest.approx(15 * f * 2 / 4)
    assert more["bandwidth_gbps"] == pytest.approx(16 / f)
    assert more["compute_rate"] == pytest.approx(1 + 0.5 * f)
    # kvstore was calibrated with 2 workers + 2 servers; paced: slower of the two rates.
    paced = M.adjust(m, "kvstore", workers=2, servers=2, paced=True, bandwidth_gbps=1.0,
                     latency_us=20.0)
    assert paced["bandwidth_gbps"] == 1.0 and paced["latency_us"] == 22.0
    assert paced["per_message_us"] == 150.0
    # a backend whose engine makes each step keeps its cost per step
    m2 = machine(backends={**BASE["backends"], "collective": BASE["backends"]["mpi"]})
    coll = M.adjust(m2, "collective", workers=3, servers=0, paced=False, bandwidth_gbps=1.0,
                    latency_us=20.0)
    assert coll["per_message_us"] == pytest.approx(
        15 * m2.contention("polled", 3, calibration_processes=2))


def test_a_compute_factor_below_1_is_kept_not_stretched():
    """A fit at the bottom of its range (0.5: the model over-predicts the workload run) is no
    excess for contention to stretch: kept as fitted, so compute never turns negative."""
    backends = copy.deepcopy(BASE["backends"])
    backends["kvstore"]["compute_factor"] = 0.5
    m = machine(backends=backends)
    for workers in (2, 3, 4):
        kv = M.adjust(m, "kvstore", workers=workers, servers=2, paced=False,
                      bandwidth_gbps=1.0, latency_us=20.0)
        assert kv["compute_rate"] == pytest.approx(0.5)
        assert kv["compute_overhead_s"] == pytest.approx(70e-6 * 0.5)


def test_blocking_compute_stretches_by_the_handoffs_beside_idle_engines():
    """``mpi``'s and ``horovod``'s engines sit idle between calls: their compute excess
    stretches by the hand-off law; the polled backends' keeps the ring step's; a profile
    without hand-offs stretches every style's by the ring step."""
    m = machine(handoff_us={2: 100.0, 3: 110.0, 4: 130.0, 6: 180.0})
    # on 2 cores: s0 = 100; (1, 10), (1, 30), (2, 80) -> k = (10 + 30 + 160) / 6
    k = 200 / 6
    assert m.compute_contention("blocking", 4, calibration_processes=2) == pytest.approx(
        (100 + k) / 100)
    assert m.compute_contention("blocking", 2, calibration_processes=2) == 1.0
    assert m.compute_contention("polled", 6, calibration_processes=4) == pytest.approx(
        m.contention("polled", 6, calibration_processes=4))
    assert machine().compute_contention("blocking", 4, calibration_processes=2) == 3.0
    more = M.adjust(m, "mpi", workers=3, servers=0, paced=False, bandwidth_gbps=1.0,
                    latency_us=20.0)
    assert more["compute_rate"] == pytest.approx(1 + 0.5 * (100 + k) / 100)
    assert more["per_message_us"] == pytest.approx(15 * 3.0 / 2)  # still the ring step's
    kv = M.adjust(m, "kvstore", workers=3, servers=3, paced=False, bandwidth_gbps=1.0,
                  latency_us=20.0)
    assert kv["compute_rate"] == pytest.approx(
        1 + 1.0 * m.contention("polled", 6, calibration_processes=4))


def _profile(tmp_path, layers):
    data = {"name": "t", "batch_size": 1, "device": "cpu", "matmul_fraction": 0.5,
            "layers": [{"name": f"l{i}", "fwd_ms": f, "bwd_ms": b,
                        "tensors": [{"name": f"t{i}", "numel": n}]}
                       for i, (f, b, n) in enumerate(layers)]}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_simulated_ring_on_a_machine_is_the_closed_form(tmp_path, workers):
    """One tensor, no compute: 2(p-1) ring steps of latency + per-message + chunk / bandwidth,
    at the machine's costs stretched by the contention law; ``mpi``'s per-message cost is
    its call's (2 steps of 15 us at the calibration's 2 workers) over the ring's steps."""
    n = 1 << 18
    path = _profile(tmp_path, [(0.0, 0.0, n)])
    m = machine()
    res = simulator.simulate(str(path), "mpi", workers=workers, bandwidth_gbps=1,
                             latency_us=20, iterations=3, warmup=1, machine=m)
    f = m.contention("blocking", workers, calibration_processes=2)
    chunk = -(-n // workers) * 4
    steps = 2 * (workers - 1)
    call = 2 * 15e-6 * f  # the call's software cost
    assert res.iteration_time_s == pytest.approx(
        steps * (2e-6 + chunk / (16e9 / f / 8)) + call, rel=1e-9)


def test_compute_on_a_machine_is_rate_times_time_plus_overhead(tmp_path):
    """Two layers with compute and a 1-element tensor each, 1 worker: no communication."""
    path = _profile(tmp_path, [(2.0, 3.0, 1), (0.0, 5.0, 1)])
    res = simulator.simulate(str(path), "mpi", workers=1, bandwidth_gbps=1, iterations=2,
                             warmup=1, machine=machine())
    rate, over = 1.5, 70e-6 * 1.5  # compute_factor 1.5 at the calibration's own count...
    # ...but 1 process is fewer than calibrated: contention min(1, step(1)/step(2)) = 1.
    calls = [2e-3, 3e-3, 5e-3]  # the zero forward of layer 1 is no call
    assert res.iteration_time_s == pytest.approx(sum(t * rate + over for t in calls))


def test_machine_path_as_a_cluster_field_equals_the_object(tmp_path):
    path = tmp_path / "m.yaml"
    machine().save(path)
    a = simulator.simulate("resnet50", "kvstore", workers=2, bandwidth_gbps=1,
                           size_scale=0.01, compute_scale=0.05, machine=str(path))
    b = simulator.simulate("resnet50", "kvstore", workers=2, bandwidth_gbps=1,
                           size_scale=0.01, compute_scale=0.05, machine=machine())
    assert a.iteration_time_s == b.iteration_time_s


def test_synthetic_profiles_load_as_workloads(tmp_path):
    from ddpbench.simulator.workload import Workload

    for name, (count, numel) in SYNTHETIC.items():
        wl = Workload.from_dict(synthetic_profile(name), source=name)
        assert len(wl.tensors) == count and {t.numel for t in wl.tensors} == {numel}
        assert all(x.fwd_s == 0 and x.bwd_s == 0 for x in wl.layers)


def test_experiment_machine_path_is_relative_to_the_file_and_must_exist(tmp_path):
    from ddpbench.experiments.schema import load_experiment

    (tmp_path / "prof").mkdir()
    machine().save(tmp_path / "prof" / "m.yaml")
    text = textwrap.dedent("""\
        name: x
        workloads: [resnet50]
        workers: 2
        machine: prof/m.yaml
        backends: [mpi]
        """)
    (tmp_path / "x.yaml").write_text(text)
    spec = load_experiment(tmp_path / "x.yaml")
    assert spec.spec.machine[0].endswith("prof/m.yaml")
    (tmp_path / "y.yaml").write_text(text.replace("prof/m.yaml", "nope.yaml"))
    with pytest.raises(ValueError, match=r"y.yaml:4: .*machine profile 'nope.yaml' not found"):
        load_experiment(tmp_path / "y.yaml")


def test_experiment_refuses_a_profile_without_its_backends_or_with_a_bad_field(tmp_path):
    from ddpbench.experiments.schema import load_experiment

    machine().save(tmp_path / "m.yaml")
    text = "name: x\nworkloads: [resnet50]\nworkers: 2\nmachine: m.yaml\nbackends: [mpi, p3]\n"
    (tmp_path / "x.yaml").write_text(text)
    with pytest.raises(ValueError, match=r"x.yaml:4: .*no calibration for backend\(s\) "
                                         r"\['p3'\] \(it has: \['kvstore', 'mpi'\]\)"):
        load_experiment(tmp_path / "x.yaml")
    data = yaml.safe_load((tmp_path / "m.yaml").read_text())
    data["cores"] = -2
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "x.yaml").write_text(text.replace("[mpi, p3]", "[mpi]"))
    with pytest.raises(ValueError, match=r"x.yaml:4: .*field 'cores'"):
        load_experiment(tmp_path / "x.yaml")


def _synthetic_paths(tmp_path):
    paths = {}
    for name in SYNTHETIC:
        paths[name] = tmp_path / f"calibration_{name}.yaml"
        paths[name].write_text(yaml.safe_dump(synthetic_profile(name)))
    return paths


def test_fit_recovers_the_costs_that_made_the_times(tmp_path):
    """Times made by the simulator at known costs are fitted back to those costs."""
    from ddpbench.calibration.run import _sim_time, fit_backend

    paths = _synthetic_paths(tmp_path)
    args = dict(workers=2, servers=0, latency_us=2.0, cores=2)
    small = _sim_time("mpi", paths["small"], 2, 0, 2.0, 10.0, 20.0, 2)
    large = _sim_time("mpi", paths["large"], 2, 0, 2.0, 10.0, 20.0, 2)
    fit = fit_backend("mpi", (paths["small"], small), (paths["large"], large),
                      bandwidth_gbps=90.0, **args)
    assert fit.bandwidth_fitted
    assert fit.per_message_us == pytest.approx(10.0, rel=0.02)
    assert fit.bandwidth_gbps == pytest.approx(20.0, rel=0.02)


def test_fit_keeps_the_ping_pong_bandwidth_when_the_large_run_is_all_messages(tmp_path):
    """p3 cuts each 4 MiB array into 27 slices: its large run can be explained by message
    costs alone; the bandwidth is then the ping-pong's, flagged, not the solve's bound."""
    from ddpbench.calibration.run import _sim_time, fit_backend

    paths = _synthetic_paths(tmp_path)
    small = _sim_time("p3", paths["small"], 2, 2, 2.0, 200.0, 1e6, 2)
    large = _sim_time("p3", paths["large"], 2, 2, 2.0, 200.0, 1e6, 2) * 0.97
    fit = fit_backend("p3", (paths["small"], small), (paths["large"], large), workers=2,
                      servers=2, latency_us=2.0, bandwidth_gbps=90.0, cores=2)
    assert not fit.bandwidth_fitted
    assert fit.bandwidth_gbps == 90.0
    assert fit.per_message_us == pytest.approx(200.0, rel=0.05)
    assert M.BackendFit.model_validate(fit.model_dump()) == fit  # it round-trips


def test_horovod_small_run_is_unfused_so_its_per_message_cost_is_identifiable(tmp_path):
    """Fused, horovod's small run is one buffer inside one 1 ms cycle: the simulated time
    is flat in the per-message cost over a wide range, so no cost could be fitted to it.
    Unfused (SYNTHETIC_KNOBS, in the real and the simulated run alike) it grows with the
    cost, and times made at a known cost are fitted back to it."""
    from ddpbench.calibration.run import SYNTHETIC_KNOBS, _sim_time, fit_backend

    paths = _synthetic_paths(tmp_path)
    fused = [_sim_time("horovod", paths["small"], 2, 0, 2.0, pm, 20.0, 2) for pm in (2.0, 8.0)]
    assert fused[0] == pytest.approx(fused[1], rel=1e-9)  # the cycle hides the cost
    knobs = SYNTHETIC_KNOBS["horovod"]["small"]
    assert knobs == {"fusion_threshold": 0, "cycle_time": 0.0}
    small = _sim_time("horovod", paths["small"], 2, 0, 2.0, 12.0, 20.0, 2, knobs=knobs)
    large = _sim_time("horovod", paths["large"], 2, 0, 2.0, 12.0, 20.0, 2,
                      knobs=SYNTHETIC_KNOBS["horovod"]["large"])
    fit = fit_backend("horovod", (paths["small"], small), (paths["large"], large), workers=2,
                      servers=0, latency_us=2.0, bandwidth_gbps=90.0, cores=2)
    assert fit.per_message_us == pytest.approx(12.0, rel=0.02)
    assert fit.bandwidth_gbps == pytest.approx(20.0, rel=0.02)


def test_shared_bandwidth_weights_each_backend_by_its_bytes_share():
    """The log-mean of the fitted bandwidths, weighted by the squared bytes share; a
    backend whose bandwidth was not fitted (the ping-pong's) has no say."""
    from ddpbench.calibration.run import shared_bandwidth

    def fit(bw, share, fitted=True):
        return M.BackendFit(per_message_us=100.0, bandwidth_gbps=bw, bytes_share=share,
                            bandwidth_fitted=fitted)

    got = shared_bandwidth({"kvstore": fit(8.0, 0.9), "byteps": fit(12.5, 0.9),
                            "p3": fit(90.0, 0.05, fitted=False)})
    assert got == pytest.approx(10.0)  # sqrt(8 x 12.5)
    got = shared_bandwidth({"kvstore": fit(8.0, 0.9), "p3": fit(20.0, 0.3)})
    assert got == pytest.approx(math.exp((0.81 * math.log(8) + 0.09 * math.log(20)) / 0.9))
    assert shared_bandwidth({"p3": fit(90.0, 0.05, fitted=False)}) is None


def test_a_shared_bandwidth_is_kept_and_the_message_cost_solved_against_it(tmp_path):
    """Times made by the simulator at 150 us and 12 Gbit/s: given the shared 12 Gbit/s,
    kvstore's fit keeps it, flags it shared, and recovers the per-message cost."""
    from ddpbench.calibration.run import _sim_time, fit_backend

    paths = _synthetic_paths(tmp_path)
    small = _sim_time("kvstore", paths["small"], 2, 2, 2.0, 150.0, 12.0, 2)
    large = _sim_time("kvstore", paths["large"], 2, 2, 2.0, 150.0, 12.0, 2)
    own = fit_backend("kvstore", (paths["small"], small), (paths["large"], large), workers=2,
                      servers=2, latency_us=2.0, bandwidth_gbps=90.0, cores=2)
    assert not own.bandwidth_shared and own.bytes_share is not None and own.bytes_share > 0.5
    fit = fit_backend("kvstore", (paths["small"], small), (paths["large"], large), workers=2,
                      servers=2, latency_us=2.0, bandwidth_gbps=90.0, cores=2,
                      shared_bandwidth=12.0)
    assert fit.bandwidth_shared and fit.bandwidth_fitted
    assert fit.bandwidth_gbps == 12.0
    assert fit.per_message_us == pytest.approx(150.0, rel=0.02)
    assert fit.large_sim_ms == pytest.approx(large * 1e3, rel=0.02)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_precise_timers_sets_the_calling_threads_timer_slack_to_1us() -> None:
    # The trainer's compute emulation sleeps on its main thread and the calibration times
    # those sleeps on its own: both must run with the slack the engine thread has (1 us),
    # not Linux's default 50 us, or every emulated layer oversleeps by it.
    import ctypes
    import threading

    from ddpbench.comm import precise_timers

    libc = ctypes.CDLL(None)
    got: list[int] = []

    def probe() -> None:
        precise_timers()
        got.append(libc.prctl(30, 0, 0, 0, 0))  # PR_GET_TIMERSLACK, nanoseconds

    t = threading.Thread(target=probe)  # a thread of its own: the test runner's keeps its slack
    t.start()
    t.join()
    assert got == [1000]


def test_real_runs_must_bind_ranks_as_the_calibration_did(tmp_path):
    from ddpbench.experiments.schema import load_experiment

    assert machine().bind == "none"  # a profile written before the field: the OS placed them
    machine().save(tmp_path / "none.yaml")
    machine(bind="core").save(tmp_path / "core.yaml")
    text = ("name: x\nmode: both\nworkloads: [resnet50]\nworkers: 2\nmachine: none.yaml\n"
            "backends: [mpi]\n")
    (tmp_path / "x.yaml").write_text(text)
    assert load_experiment(tmp_path / "x.yaml").spec.real.bind == "none"  # the default
    (tmp_path / "x.yaml").write_text(text.replace("none.yaml", "core.yaml"))
    with pytest.raises(ValueError, match=r"x.yaml:5: .*calibrated with bind: core, but this "
                                         r"experiment's real runs use bind: none"):
        load_experiment(tmp_path / "x.yaml")
    (tmp_path / "x.yaml").write_text(text.replace("none.yaml", "core.yaml")
                                     + "real: {bind: core}\n")
    assert load_experiment(tmp_path / "x.yaml").spec.real.bind == "core"
    # A simulated-only experiment runs nothing real: any profile will do.
    (tmp_path / "x.yaml").write_text(text.replace("mode: both", "mode: simulate")
                                     .replace("none.yaml", "core.yaml"))
    load_experiment(tmp_path / "x.yaml")


def test_a_real_point_is_keyed_on_its_binding_unless_it_is_the_os_default():
    from ddpbench.experiments.throughput.points import key_params

    base = {"mode": "real", "backend": "mpi", "workload": "resnet50", "workers": 2,
            "compute": "sleep", "timeout_s": 300.0}
    # Rows run before the field existed were placed by the OS: they stay valid at "none".
    assert "bind" not in key_params({**base, "bind": "none"})
    assert key_params({**base, "bind": "core"})["bind"] == "core"


def test_a_launch_stands_for_its_lower_quartile():
    assert M.launch_time([4.0, 1.0, 3.0, 2.0]) == 2.0  # index 4 // 4 = 1 of 1, 2, 3, 4
    assert M.launch_time([5.0]) == 5.0
    assert M.launch_time([float(x) for x in range(40, 0, -1)]) == 11.0  # index 10
    with pytest.raises(ValueError, match="no iteration times"):
        M.launch_time([])


def test_solve_meets_the_target_in_few_simulations_and_keeps_the_root_bracketed():
    from ddpbench.calibration.run import _solve

    calls = []

    def linear(p: float) -> float:  # a time linear in a per-message cost
        calls.append(p)
        return 2e-3 + 64 * p * 1e-6

    p = _solve(linear, 5e-3, 0.0, 1e5, increasing=True)
    assert p == pytest.approx(3e-3 / 64e-6, rel=1e-6)
    assert len(calls) <= 4  # the two ends, then false position lands on it

    def bandwidth(b: float) -> float:  # 16 MiB at b Gbit/s plus a fixed cost
        return 1e-3 + 16 * 2**20 * 8 / (b * 1e9)

    b = _solve(bandwidth, 1e-3 + 16 * 2**20 * 8 / 12.5e9, 0.01, 1e4, increasing=False,
               inverse=True)
    assert b == pytest.approx(12.5, rel=1e-6)
    # Outside the range: clamped to the ends.
    assert _solve(linear, 1e-3, 0.0, 1e5, increasing=True) == 0.0
    assert _solve(linear, 1e3, 0.0, 1e5, increasing=True) == 1e5

    def steps(x: float) -> float:  # no exact root: converges to the jump
        return float(int(x * 10)) / 10

    x = _solve(steps, 0.55, 0.0, 1.0, increasing=True)
    assert x == pytest.approx(0.6, abs=1e-6)


def test_compare_counts_the_values_within_10_percent_backend_fits_apart(capsys):
    from ddpbench.commands.calibrate import _compare, fitted_values

    old = machine()
    new = machine(latency_us=old.latency_us * 1.5,
                  backends={"mpi": {"per_message_us": 15.0 * 1.05, "bandwidth_gbps": 16.0 * 1.2,
                                    "compute_factor": 1.5},
                            "kvstore": {"per_message_us": 150.0, "bandwidth_gbps": 4.0,
                                        "compute_factor": 2.0 * 0.85}})
    _compare(old, new)
    out = capsys.readouterr().out
    total = len(fitted_values(old))
    assert f"{total - 3} of {total} fitted values within 10% of the earlier profile " \
           f"(4 of 6 backend fits, {total - 7} of {total - 6} machine figures)" in out
    assert "mpi.bandwidth_gbps" in out and " 1.200" in out


def test_compare_shows_each_backend_fits_launch_spread_and_counts_the_moves_within_it(capsys):
    from ddpbench.commands.calibrate import _compare, launch_spread

    def runs(small, workload):
        # Each launch: 8 iterations at one time (its median and lower quartile alike).
        return {"iteration_ms": {"mpi": {"small": [[t] * 8 for t in small],
                                         "large": [[5.0] * 8] * 3,
                                         "resnet50": [[t] * 8 for t in workload]}}}

    old = machine(measurements=runs([1.0, 1.2, 1.1], [30.0, 30.0, 30.0]))
    new = machine(measurements=runs([1.0, 1.0, 1.0], [30.0, 45.0, 36.0]),
                  backends={"mpi": {"per_message_us": 15.0 * 1.15, "bandwidth_gbps": 16.0,
                                    "compute_factor": 1.5 * 1.6},
                            "kvstore": {"per_message_us": 150.0, "bandwidth_gbps": 4.0,
                                        "compute_factor": 2.0}})
    assert launch_spread(old, "mpi", "small") == pytest.approx(0.2 / 1.1)
    assert launch_spread(new, "mpi", "resnet50") == pytest.approx(15.0 / 36.0)
    assert launch_spread(new, "kvstore", "small") is None  # no launches stored
    _compare(old, new)
    out = capsys.readouterr().out
    # per_message moved 15% within its launches' 18.2%; compute_factor 60% beyond 41.7%.
    assert "launches  18.2%" in out and "launches  41.7%" in out
    assert "of the 2 backend fits outside 10% (with launches stored), 1 moved by less" in out


def test_refit_from_stored_launches_reproduces_the_fits():
    """A profile keeps every launch of its runs: fitting again from them on the same code
    gives the fits it stored (to their rounding), here mpi's from the shipped profile."""
    from pathlib import Path

    from ddpbench.calibration.run import refit

    shipped = M.load_machine(Path(__file__).parents[2] / "reports/real_local/machine.yaml")
    launches = shipped.measurements["iteration_ms"]
    one = shipped.model_copy(update={
        "backends": {"mpi": shipped.backends["mpi"]},
        "measurements": {**shipped.measurements, "iteration_ms": {"mpi": launches["mpi"]}}})
    again = refit(one, size_scale=0.01).backends["mpi"]
    before = shipped.backends["mpi"]
    for field in ("per_message_us", "bandwidth_gbps", "compute_factor"):
        assert getattr(again, field) == pytest.approx(getattr(before, field), rel=1e-3)
    with pytest.raises(ValueError, match="stores no launches to refit from"):
        refit(machine(), size_scale=0.01)
