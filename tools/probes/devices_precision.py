"""Print the device and precision rules against published single-GPU training throughputs.

Run: ``python tools/probes/devices_precision.py``. The figures and their sources are those
of tests/unit/test_hardware_precision.py and tests/unit/test_workloads_today.py; the
results log docs/results/2026-12-02-devices-precision.md records one run.
"""

from __future__ import annotations

from ddpbench.profiling.llm import LLAMAS
from ddpbench.simulator import make_profiles, simulate
from ddpbench.simulator.workload import load_workload

# (workload, device, from, to, published speedup)
SPEEDUPS = [("resnet50", "V100", "fp32", "fp16", 1200 / 367),
            ("resnet50", "A100-80GB", "tf32", "fp16", 2470 / 938),
            ("bert_large", "A100", "tf32", "fp16", 415 / 234),
            ("bert_large", "V100", "fp32", "fp16", 3.75)]
# (workload, device, batch, precision, published samples/s)
THROUGHPUTS = [("resnet50", "V100", 256, "fp32", 367), ("resnet50", "V100", 256, "fp16", 1200),
               ("resnet50", "A100-80GB", 256, "tf32", 938),
               ("resnet50", "A100-80GB", 256, "fp16", 2470),
               ("bert_large", "V100", 8, "fp32", 40), ("bert_large", "V100", 16, "fp16", 164),
               ("bert_large", "A100", 54, "tf32", 234), ("bert_large", "A100", 64, "fp16", 415)]
NEMO_FP8_H100 = {"7b": (16934, 780), "13b": (8715, 760), "70b": (1728, 768)}


def _compute_s(workload: str, device: str, precision: str) -> float:
    wl = load_workload(workload)
    return wl.compute_factor(device, None, precision) * sum(x.fwd_s + x.bwd_s for x in wl.layers)


def main() -> None:
    print("| workload | device | from | to | published | rule | error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for wl, dev, old, new, pub in SPEEDUPS:
        s = _compute_s(wl, dev, old) / _compute_s(wl, dev, new)
        print(f"| {wl} | {dev} | {old} | {new} | {pub:.2f} | {s:.2f} | {s / pub - 1:+.1%} |")
    print("\n| workload | device | batch | precision | published | simulated | error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for wl, dev, batch, p, pub in THROUGHPUTS:
        r = simulate(wl, "mpi", workers=1, bandwidth_gbps=10, device=dev, batch_size=batch,
                     precision=p)
        print(f"| {wl} | {dev} | {batch} | {p} | {pub} | {r.throughput:.0f} | "
              f"{r.throughput / pub - 1:+.1%} |")
    print("\n| model | params | tensors | FLOPs/token | step ms (H100 bf16) | tokens/s bf16 | "
          "tokens/s fp8 | NeMo fp8 | error | NeMo FLOPs/token |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for size, (h, ff, layers, heads, kv) in LLAMAS.items():
        wl = load_workload(f"llama_{size}")
        step = sum(x.fwd_s + x.bwd_s for x in wl.layers)
        per_token = make_profiles.llama_flops_per_token(h, ff, layers, heads, kv, 4096)
        fp8 = simulate(f"llama_{size}", "mpi", workers=1, bandwidth_gbps=10, device="H100",
                       precision="fp8")
        tok8 = 4096 / fp8.iteration_time_s
        nemo = NEMO_FP8_H100.get(size)
        cells = (f"{nemo[0]:,} | {tok8 / nemo[0] - 1:+.1%} | {nemo[1] * 1e12 / nemo[0]:.4g}"
                 if nemo else "- | - | -")
        print(f"| llama_{size} | {wl.total_params:,} | {len(wl.tensors)} | {per_token:.4g} | "
              f"{step * 1e3:.1f} | {4096 / step:,.0f} | {tok8:,.0f} | {cells} |")
    vit = load_workload("vit_l")
    step = sum(x.fwd_s + x.bwd_s for x in vit.layers)
    print(f"\nvit_l: {vit.total_params:,} parameters, {len(vit.tensors)} tensors, step "
          f"{step * 1e3:.1f} ms at batch {vit.batch_size} (H100 bf16), "
          f"{vit.batch_size / step:,.0f} images/s")


if __name__ == "__main__":
    main()
