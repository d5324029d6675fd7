"""Run on N ranks (colocated: N servers): the real key counter places every part where the
shared rule (:func:`ddpbench.rules.placement.declared_keys`) says.

Usage: python ps_declare.py
For VGG-19 and ResNet-50 (their tensor names, sizes / 1,000), ``byteps`` declares the
gradients as BytePS-PyTorch does (sorted names) and ``p3`` as MXNet's ``kv.init`` does
(definition order); both then push in backward order, as the throughput worker does.
Every part must be where the rule puts it and every message must go there; rank 0 reports
one JSON line per (backend, model).
"""

from __future__ import annotations

import numpy as np
from _results import result

import ddpbench
from ddpbench.rules import placement
from ddpbench.rules.placement import declaration_order, declared_keys
from ddpbench.simulator import load_workload

PARTITION = 1024  # elements (byteps' partition_bytes 4,096 of float32), slice 1,000 (p3)


def run(backend: str, model: str, knobs: dict, rule) -> None:
    wl = load_workload(model)
    names = [t.name for t in wl.tensors]
    sizes = [max(1, t.numel // 1000) for t in wl.tensors]
    kv = ddpbench.create(backend, trace=True, **knobs)
    r, s = kv.rank, kv.num_servers
    # the names as the front end passes them (strings), declared in its order
    kv.declare([names[i] for i in declaration_order(backend, names)])
    keys = declared_keys(backend, names)
    handles = [kv.push_pull_async(names[i], np.full(sizes[i], r + 1.0, np.float32))
               for i in reversed(range(len(names)))]  # backward: last layer first
    for h in handles:
        h.wait()
    moved = 0
    for i, name in enumerate(names):
        want = [(p.offset, p.count, p.server) for p in rule(keys[i], sizes[i], s) if p.count]
        got = [(p.offset, p.count, p.server) for p in kv.placement(name)]
        assert got == want, (backend, model, name, got, want)
        moved += sum(p.server != q.server for p, q in  # against the definition index
                     zip(rule(i, sizes[i], s), kv.placement(name)))
    # and every push went to that server
    key_of = {kv._keys[n]: n for n in names}
    for rec in kv.trace_records:
        if rec.kind == "push":
            server = kv.placement(key_of[rec.key])[rec.part].server
            assert rec.dst == f"worker{server}", (rec, server)
    if r == 0:
        result("declared", backend=backend, model=model, servers=s, tensors=len(names),
               parts=sum(len(kv.placement(n)) for n in names), off_definition_order=moved)
    kv.close()


def main() -> None:
    for model in ("vgg19", "resnet50"):
        run("byteps", model, {"partition_bytes": PARTITION * 4},
            lambda key, n, s: placement.byteps_parts(key, n, PARTITION, s))
        run("p3", model, {"slice_params": 1000},
            lambda key, n, s: placement.p3_parts(key, n, 1000, s))


if __name__ == "__main__":
    main()
