"""Parameter-server pieces that need no MPI: placement, wire format, gates, SGD, traces."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ddpbench.backends import ps_common as pc
from ddpbench.backends.kvstore import KVStoreBackend
from ddpbench.backends.p3 import P3Store


def test_even_split_matches_array_split():
    for n, s in [(10, 3), (7, 7), (1_000_001, 4)]:
        parts = pc.even_split(n, s)
        shares = np.array_split(np.arange(n), s)
        assert [(p.offset, p.count, p.server) for p in parts] == [
            (int(a[0]) if len(a) else p.offset, len(a), i) for i, (a, p) in enumerate(zip(shares, parts))]


def test_round_robin_counter_continues_across_arrays():
    counter = iter(range(100))
    a = pc.round_robin(25, 10, lambda: next(counter), 3)
    b = pc.round_robin(5, 10, lambda: next(counter), 3)
    assert [(p.offset, p.count, p.server) for p in a] == [(0, 10, 0), (10, 10, 1), (20, 5, 2)]
    assert [(p.offset, p.count, p.server) for p in b] == [(0, 5, 0)]


def test_message_round_trip_keeps_header_and_payload():
    x = np.arange(5, dtype=np.float64) / 3
    msg = pc.Msg(pc.PUSHPULL, 2, key=7, part=3, priority=-4, payload=x, dtype="float64",
                 op="max", postscale=0.25, root=1, flags=pc.FLAG_DATA | pc.FLAG_GATED)
    msg.t_start = 12.5
    back = pc.Msg.decode(msg.encode(), src=1, dst=2)
    got = (back.kind, back.key, back.part, back.priority, back.op, back.postscale, back.root,
           back.flags, back.t_start, back.count, back.src)
    assert got == (pc.PUSHPULL, 7, 3, -4, "max", 0.25, 1, msg.flags, 12.5, 5, 1)
    assert np.array_equal(back.payload, x) and back.payload.dtype == np.float64
    assert back.nbytes == 40
    ctrl = pc.Msg.decode(pc.Msg(pc.PULL, 0, key=1).encode(), 0, 0)
    assert ctrl.payload is None and ctrl.nbytes == 0


def test_gate_lets_one_oversized_message_through_alone():
    g = pc.Gate(100)
    assert g.fits(500)  # nothing in flight
    g.used = 60
    assert g.fits(40) and not g.fits(41)


def test_sgd_step_is_mxnets_update():
    opt = pc.SGD(lr=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5, clip_gradient=1.0)
    w = np.array([1.0, -2.0, 3.0])
    g = np.array([4.0, 0.5, -1.0])
    ref_w, mom = w.copy(), np.zeros(3)
    for _ in range(3):
        r = np.clip(0.5 * g, -1, 1) + 0.01 * ref_w
        mom = 0.9 * mom - 0.1 * r
        ref_w = ref_w + mom
    state = None
    for _ in range(3):
        state = opt.step(w, g, state)
    np.testing.assert_allclose(w, ref_w, rtol=1e-15)
    plain = np.array([1.0, 2.0])
    assert pc.SGD(lr=0.5).step(plain, np.array([2.0, 4.0]), None) is None
    assert plain.tolist() == [0.0, 0.0]


def test_options_validate_with_the_valid_names():
    with pytest.raises(ValueError, match="valid options"):
        P3Store.parse_options({"slice": 5})
    with pytest.raises(ValueError, match="water_mark"):
        P3Store.parse_options({"water_mark": 0})
    with pytest.raises(ValueError, match="servers"):
        KVStoreBackend.parse_options({"servers": "remote"})
    assert KVStoreBackend.parse_options({}).bigarray_bound == 1_000_000
    assert P3Store.parse_options({}).slice_params == 40_000


def test_chrome_trace_has_the_simulators_layout(tmp_path):
    recs = [pc.SendRecord(10.0, 10.5, "push", 3, 0, -2, 400, "worker0", "server0"),
            pc.SendRecord(10.2, 10.3, "pull", 3, 0, -2, 400, "server0", "worker0")]
    trace = pc.chrome_trace(recs, layer_of=lambda k: k - 1)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["cat"], e["tid"], round(e["ts"], 3), round(e["dur"], 3))
            for e in spans] == [("push L2", "push", 1, 0.0, 0.5e6), ("pull L2", "pull", 1, 0.2e6,
                                                                      0.1e6)]
    assert spans[0]["args"]["bytes"] == 400 and spans[0]["args"]["peer"] == "server0"
    for host, rec in (("worker0", recs[0]), ("server0", recs[1])):
        (tmp_path / f"sends.{host}.json").write_text(json.dumps(pc.chrome_trace([rec])))
    merged = json.loads(pc.merge_chrome_traces(tmp_path, tmp_path / "all.json").read_text())
    names = {e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"}
    assert names == {"worker0", "server0"}
