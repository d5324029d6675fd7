"""The published data points of the ``validation`` kind: the shipped file validates, and a
malformed point is refused with its id and field named."""

from __future__ import annotations

import copy
import functools

import pytest

from ddpbench import safeyaml
from ddpbench.experiments.validation import data


@functools.cache
def _shipped() -> dict:
    return safeyaml.load(data.DEFAULT_FILE.read_text(encoding="utf-8"))


def _raw() -> dict:
    return copy.deepcopy(_shipped())


def test_shipped_points_validate_and_cover_enough_sources():
    pub = data.load()
    assert len(pub.points) >= 25
    assert len({p.source for p in pub.points}) >= 4
    # Four distinct publications or documentation sets behind the source keys.
    families = {k.split("_")[0] for k in {p.source for p in pub.points}}
    assert {"p3", "horovod", "byteps", "bytescheduler"} <= families
    for p in pub.points:
        assert p.quote.strip() and p.where.strip()
        assert p.simulate or p.reason


def test_p3_gain_points_carry_the_abstract_values():
    by_id = {p.id: p for p in data.load().points}
    assert [by_id[i].value for i in ("p3_resnet50_peak", "p3_sockeye_peak", "p3_vgg19_peak")] \
        == [1.25, 1.38, 1.66]
    assert "25%, 38% and 66%" in by_id["p3_vgg19_peak"].quote


def test_byteps_points_run_nccl_2_3_7():
    # Every BytePS figure ran on NCCL 2.3.7 (the repository's images until 2019-12-19):
    # each simulated point of a BytePS source says so, so that neither side of a comparison
    # gets a protocol (LL128 came in 2.5.6) or a second ring its NCCL did not have.
    points = [p for p in data.load().points if p.source.startswith("byteps") and p.simulate]
    assert len(points) >= 7
    for p in points:
        assert p.setting.nccl_version == "2.3.7", p.id


def _write(tmp_path, raw):
    path = tmp_path / "pub.yaml"
    path.write_text(safeyaml.dump(raw))
    return path


@pytest.mark.parametrize("edit, words", [
    (lambda r: r["points"][0].update(source="nowhere"), "unknown source 'nowhere'"),
    (lambda r: r["points"][0]["setting"].update(device="GTX480"), "unknown device 'GTX480'"),
    (lambda r: r["points"][0]["setting"].update(transport="carrier_pigeon"),
     "unknown transport"),
    (lambda r: r["points"][0].update(metric="speed"), "metric"),
    (lambda r: r["points"][0].pop("baseline"), "needs a baseline"),
    (lambda r: r["points"][0].update(value=-1), "value"),
    (lambda r: r["points"][0]["setting"].update(batch_size=0), "batch_size"),
    (lambda r: r["points"][1].update(id=r["points"][0]["id"]), "appears twice"),
    (lambda r: r["points"][0].update(assumed=["colour"]), "assumed field 'colour'"),
    (lambda r: r["points"][0]["setting"].update(bandwidth_gbps=10), "sweeps the bandwidth"),
    (lambda r: r["points"][0].update(baseline_transport="carrier_pigeon"), "unknown transport"),
    (lambda r: next(p for p in r["points"] if p["metric"] == "scaling_efficiency"
                    and p.get("simulate", True)).update(baseline_transport="tcp"),
     "baseline_transport needs a baseline"),
    (lambda r: next(p for p in r["points"] if p.get("simulate", True)
                    and p["setting"].get("workload") == "resnet50")["setting"].update(
        precision="mixed"), "records none"),
    (lambda r: next(p for p in r["points"] if p.get("simulate", True) and p["setting"].get(
        "workload") == "none")["setting"].update(nccl_algo="Tree", nccl_version="2.3.7"),
     "nccl_algo"),
])
def test_a_bad_point_is_refused_naming_it(tmp_path, edit, words):
    raw = _raw()
    edit(raw)
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        data.load(_write(tmp_path, raw))


def test_a_non_mapping_file_is_refused(tmp_path):
    path = tmp_path / "pub.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        data.load(path)


def test_a_revised_setting_gives_the_point_a_new_key():
    """The setting travels in a private parameter; the key must still follow it."""
    from ddpbench.experiments import manifest
    from ddpbench.experiments.naming import public
    from ddpbench.experiments.validation.run import key_params

    base = {"id": "x", "mode": "simulate", "_point": '{"servers": "colocated"}',
            "_bandwidths": "[1, 10]", "_iterations": 3, "_warmup": 1}
    revised = {**base, "_point": '{"servers": 8}'}
    key = manifest.point_key("validation", public(key_params(base)))
    assert key != manifest.point_key("validation", public(key_params(revised)))
    assert key == manifest.point_key("validation", public(key_params(dict(base))))


def test_a_baseline_transport_runs_the_baseline_over_that_transport():
    """RDMA over TCP: the same backend, the baseline on the other transport."""
    import json

    from ddpbench.experiments.throughput.points import run_point as run_throughput
    from ddpbench.experiments.validation.run import run_point

    point = data.Point.model_validate({
        "id": "x", "source": "s", "where": "w", "quote": "q", "metric": "speedup",
        "setting": {"workload": "vgg19", "hosts": 4, "gpus_per_host": 1,
                    "transport": "rdma", "bandwidth_gbps": 10},
        "backend": "horovod", "baseline": "horovod", "baseline_transport": "tcp",
        "value": 1.1})
    row = run_point({"_point": point.model_dump_json(), "_bandwidths": json.dumps([10]),
                     "_iterations": 3, "_warmup": 1})

    def thr(transport: str) -> float:
        return float(run_throughput({
            "mode": "simulate", "workload": "vgg19", "backend": "horovod", "workers": 4,
            "hosts": 4, "gpus_per_host": 1, "bandwidth_gbps": 10.0, "latency_us": 5.0,
            "transport": transport, "intra_link": "pcie", "iterations": 3,
            "warmup": 1})["throughput"])

    assert row["simulated"] == pytest.approx(thr("rdma") / thr("tcp"), rel=1e-12)
    assert row["simulated"] > 1  # RDMA's efficiency and message cost beat TCP's
