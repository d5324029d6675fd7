"""Horovod's timeline (HOROVOD_TIMELINE) from the real backends, read back as Chrome traces.

horovod/common/timeline.cc and its callers: the coordinator writes, per tensor (a process
of the trace), a NEGOTIATE_ALLREDUCE span holding a zero-length span per rank as its
request is counted (controller.cc IncrementTensorCount; a cached tensor has none,
CoordinateCacheAndState), then ALLREDUCE holding its activities: INIT_FUSION_BUFFER,
MEMCPY_IN_FUSION_BUFFER, MPI_ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER for a fused group, the
allreduce alone for a single tensor (ops/mpi_operations.cc), written for every tensor of a
group with the same times (ActivityStartAll).
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from mpiutil import SCRIPTS, one, run_mpi

FUSED = {"t0": "t1", "t1": "t0", "t3": "t4", "t4": "t3"}  # [t0 t1] [t2] [t3 t4] [t5]
COPIES = ["MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"]


def spans(path):
    """Parse ``path`` as Chrome-trace JSON; return tensor -> its spans in time order."""
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    name_of = {e["pid"]: e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "process_name"}
    out = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["tid"] == 0
            out[name_of[e["pid"]]].append(e)
    for evs in out.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    return out


def inside(child, parent):
    return parent["ts"] <= child["ts"] and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"]


def tops(evs, name):
    return [e for e in evs if e["name"] == name]


def children(evs, parent):
    return [e["name"] for e in evs if e is not parent and inside(e, parent)]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_horovod_mpi_and_collective_write_horovods_timeline(n, tmp_path):
    out = run_mpi(n, SCRIPTS / "timeline_check.py", str(tmp_path), timeout=120)
    assert one(out, "horovod")["groups"][:4] == [["t0", "t1"], ["t2"], ["t3", "t4"], ["t5"]]
    hv = spans(tmp_path / "horovod.json")
    ranks = [str(r) for r in range(n)]
    for t in ["t0", "t1", "t2", "t3", "t4", "t5"]:
        evs = hv[t]
        negs, ops = tops(evs, "NEGOTIATE_ALLREDUCE"), tops(evs, "ALLREDUCE")
        assert len(negs) == len(ops) == 2  # one of each per step
        # the first step negotiates through the coordinator (a span per rank), the second
        # through the cache (none)
        assert sorted(children(evs, negs[0])) == ranks
        assert children(evs, negs[1]) == []
        for neg, op in zip(negs, ops):
            assert neg["ts"] + neg["dur"] <= op["ts"]
            assert op["args"]["dtype"] == "float32"
            inner = [c for c in children(evs, op) if c != "INIT_FUSION_BUFFER"]
            assert inner == (COPIES if t in FUSED else ["MPI_ALLREDUCE"])
            if t in FUSED:  # a fused group shares one allreduce
                mine = next(e for e in evs if e["name"] == "MPI_ALLREDUCE" and inside(e, op))
                peer = [e for e in hv[FUSED[t]] if e["name"] == "MPI_ALLREDUCE"
                        and (e["ts"], e["dur"]) == (mine["ts"], mine["dur"])]
                assert len(peer) == 1
    assert "INIT_FUSION_BUFFER" in children(hv["t0"], tops(hv["t0"], "ALLREDUCE")[0])
    (bcast,) = tops(hv["w"], "BROADCAST")
    assert children(hv["w"], bcast) == ["MPI_BCAST"]
    assert len(tops(hv["w"], "NEGOTIATE_BROADCAST")) == 1

    for r in range(n):
        assert "ranks [0] asked for a timeline" in one(out, "mismatch", rank=r)["message"]

    mp = spans(tmp_path / "mpi.json")
    for t in ["m0", "m1", "m2"]:  # queued on the engine behind each other
        (op,) = tops(mp[t], "ALLREDUCE")
        assert children(mp[t], op) == ["QUEUE", "CONSISTENCY_CHECK", "MPI_ALLREDUCE"]
    (op,) = tops(mp["m3"], "ALLREDUCE")  # run on the caller's thread: no queue
    assert children(mp["m3"], op) == ["CONSISTENCY_CHECK", "MPI_ALLREDUCE"]

    # the first step runs unfused, each name on ring k % 2; the second in Paddle's buckets
    rings = one(out, "collective")["rings"]
    assert rings == [["l2.w", "l1.w", "l0.b", ["l2.w", "l2.b"], ["l0.w", "l0.b"]],
                     ["l2.b", "l0.w", "l1.w"]]
    co = spans(tmp_path / "collective.json")
    for t in ["l2.w", "l2.b", "l1.w", "l0.w", "l0.b"]:
        first, second = tops(co[t], "ALLREDUCE")
        assert children(co[t], first) == ["QUEUE", "c_allreduce_sum"]
        fused = t != "l1.w"
        assert children(co[t], second) == (
            ["QUEUE", "MEMCPY_IN_FUSION_BUFFER", "c_allreduce_sum", "MEMCPY_OUT_FUSION_BUFFER"]
            if fused else ["QUEUE", "c_allreduce_sum"])
        ring = [e["args"]["ring"] for e in co[t] if e["name"] == "c_allreduce_sum"]
        assert ring[1] == (1 if t == "l1.w" else 0)


@pytest.mark.mpi
def test_the_timeline_of_a_killed_coordinator_still_parses(tmp_path):
    """Rank 0 is killed (SIGKILL) after two reductions: the file it leaves is valid JSON
    and holds both (each operation's spans are written before its handle completes)."""
    run_mpi(2, SCRIPTS / "timeline_check.py", str(tmp_path), "kill", timeout=60,
            expect_fail=True)
    hv = spans(tmp_path / "horovod.json")
    for t in ["a", "b"]:
        (op,) = tops(hv[t], "ALLREDUCE")
        assert children(hv[t], op) == ["MPI_ALLREDUCE"]
    assert "c" not in hv or not tops(hv["c"], "ALLREDUCE")


def test_dynamic_timeline_is_refused():
    """HOROVOD_TIMELINE=DYNAMIC starts the timeline from the program (hvd.start_timeline),
    which ddpbench does not offer: refused with the reason, before any process starts."""
    import ddpbench

    with pytest.raises(ValueError, match="DYNAMIC"):
        ddpbench.api.backend_class("horovod").parse_options({"timeline": "DYNAMIC"})
