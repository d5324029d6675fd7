"""``ddpbench profile``: time a PyTorch model's training step and write it as a workload."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = ("profile a PyTorch model (torchvision:NAME or package.module:factory) into a workload "
        "YAML, or write a generated one (llama_1b/7b/13b/70b, llama3_8b/70b, vit_l, "
        "mpt_7b/13b/70b) at a sequence length and micro-batch of your own")

GENERATED = ("llama_1b", "llama_7b", "llama_13b", "llama_70b", "llama3_8b", "llama3_70b",
             "vit_l", "mpt_7b", "mpt_13b", "mpt_70b")
"""Models that ``ddpbench profile NAME`` writes from their layer definitions (FLOPs at a
device's peak, simulator/make_profiles.py) instead of measuring: no torch, no GPU."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="torchvision:NAME (built without weights, nothing is "
                                      "downloaded) or package.module:factory returning a "
                                      "torch.nn.Module, measured; or one of "
                                      f"{', '.join(GENERATED)}, generated from its layer "
                                      "definitions (ddpbench.profiling.llm:llama_7b measures "
                                      "the same model)")
    parser.add_argument("--batch-size", "-B", type=int, required=True,
                        help="samples per step (one worker's batch; a generated Llama's "
                             "micro-batch of sequences)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="a generated Llama's tokens per sequence (default 4096)")
    parser.add_argument("--on", default=None, metavar="DEVICE",
                        help="a generated model's device of ddpbench.hardware.DEVICES "
                             "(default H100)")
    parser.add_argument("--precision", default=None,
                        help="a generated model's precision: fp32, tf32, fp16, bf16 or fp8 "
                             "(default bf16)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where to run the steps (default cpu)")
    parser.add_argument("--input-shape", type=_shape, default=None, metavar="C,H,W",
                        help="shape of one input sample without the batch (default 3,224,224; "
                             "3,299,299 for inception_v3)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps before the timed ones (default 2)")
    parser.add_argument("--repeats", "-r", type=int, default=5,
                        help="timed steps, each with hooks and without (default 5); layer "
                             "times are medians over them")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default torch's own choice); 1 is the "
                             "steadiest on a shared machine")
    parser.add_argument("--malloc", choices=("keep", "system"), default="keep",
                        help="keep: the C allocator keeps freed memory for the next step "
                             "(glibc mmap and trimming off), so CPU layer times do not carry "
                             "page faults that vary from step to step (default); system: "
                             "leave the allocator as it is")
    parser.add_argument("--name", help="workload name in the file (default the model's name)")
    parser.add_argument("--compare", metavar="WORKLOAD",
                        help="after profiling, compare with another workload (shipped name or "
                             "YAML): tensor list equality and forward+backward time per layer "
                             "group")
    parser.add_argument("--output", "-o", required=True, metavar="FILE.yaml",
                        help="where to write the workload profile")
    from ddpbench.sizes import add_allow_flag

    add_allow_flag(parser, "the profile")


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 3,224,224, got {text!r}") from None
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"expected positive integers like 3,224,224, got {text!r}")
    return dims


def main(args: argparse.Namespace) -> int:

    from ddpbench import profiling
    from ddpbench.cli import UsageError, check_writable_file
    from ddpbench.simulator import Workload, load_workload

    out = Path(args.output)
    if out.suffix not in (".yaml", ".yml"):
        raise UsageError(f"--output {args.output!r}: a workload file ends in .yaml or .yml")
    check_writable_file(args.output, "--output")
    if args.model in GENERATED:
        return _generate(args, out)
    for flag in ("seq_len", "on", "precision"):
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} is for a generated model "
                             f"({', '.join(GENERATED)}), not {args.model!r}")
    other = None
    if args.compare:
        try:
            other = load_workload(args.compare)
        except ValueError as err:
            raise UsageError(f"--compare: {err}") from None

    def progress(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    try:
        profiling.import_torch()
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(f"profiling {args.model} on {args.device}, batch {args.batch_size}: {args.warmup} "
          f"warm-up and {args.repeats} timed steps", file=sys.stderr, flush=True)
    if args.threads is not None:
        if args.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {args.threads}")
        profiling.import_torch().set_num_threads(args.threads)
    malloc = "system"
    if args.malloc == "keep":
        malloc = "keep" if profiling.keep_freed_memory() else "system (mallopt unavailable)"
    try:
        data = profiling.profile(args.model, batch_size=args.batch_size, device=args.device,
                                 input_shape=args.input_shape, warmup=args.warmup,
                                 repeats=args.repeats, progress=progress,
                                 allow_large=args.allow_large)
    except ValueError as err:
        raise UsageError(str(err)) from None
    data["measured"]["malloc"] = malloc
    if args.name:
        data["name"] = args.name
    workload = Workload.from_dict(data, source=str(out))  # what simulate will read back
    header = (f"# Workload profile {data['name']}: {len(workload.tensors)} tensors, "
              f"{workload.total_params:,} parameters.\n"
              f"# Written by `{_command(args)}`;\n"
              "# times are milliseconds per step at batch_size, medians over the timed steps.\n")
    out.write_text(header + _dump(data))
    meas = data["measured"]
    print(f"{data['name']}: {len(data['layers'])} layers, {len(workload.tensors)} tensors, "
          f"{workload.total_params:,} parameters ({workload.model_bytes / 2**20:.1f} MiB fp32)")
    print(f"step {meas['step_ms']:.1f} ms median without hooks (min {meas['step_ms_min']:.1f}, "
          f"max {meas['step_ms_max']:.1f}, spread {meas['step_spread']:.0%}); layers sum to "
          f"{meas['layers_sum_ms']:.1f} ms = {meas['layers_sum_vs_step']:.3f} x the step; "
          f"matmul fraction {data['matmul_fraction']}")
    print(f"wrote {out}")
    if other is not None:
        _compare(workload, other, args.compare)
    return 0


def _generate(args: argparse.Namespace, out: Path) -> int:
    """Write the generated profile of ``args.model`` (:data:`GENERATED`) to ``out``."""
    from ddpbench.cli import UsageError
    from ddpbench.simulator import Workload, make_profiles

    kw = {"device": args.on or make_profiles.LLM_DEVICE,
          "precision": args.precision or make_profiles.LLM_PRECISION}
    try:
        if args.model == "vit_l":
            if args.seq_len is not None:
                raise ValueError("--seq-len: vit_l's sequence is its 197 patches and class token")
            data = make_profiles.vit_l(args.batch_size, **kw)
        elif args.model.startswith("mpt_"):
            data = make_profiles.mpt(args.model.removeprefix("mpt_"),
                                     seq_len=args.seq_len or make_profiles.MPT_SEQ_LEN,
                                     micro_batch=args.batch_size, **kw)
        else:
            from ddpbench.profiling.llm import llama_size

            data = make_profiles.llama(llama_size(args.model), seq_len=args.seq_len,
                                       micro_batch=args.batch_size, **kw)
        if args.name:
            data["name"] = args.name
        workload = Workload.from_dict(data, source=str(out))
    except ValueError as err:
        raise UsageError(str(err)) from None
    command = (f"ddpbench profile {args.model} --batch-size {args.batch_size}"
               + (f" --seq-len {args.seq_len}" if args.seq_len else "")
               + f" --on {kw['device']} --precision {kw['precision']} -o {args.output}")
    header = (f"# Workload profile {data['name']}: {len(workload.tensors)} tensors, "
              f"{workload.total_params:,} parameters.\n# Written by `{command}`;\n"
              "# generated from layer definitions (simulator/make_profiles.py): milliseconds "
              "per step at batch_size.\n")
    out.write_text(header + _dump(data))
    step = sum(x.fwd_s + x.bwd_s for x in workload.layers)
    print(f"{data['name']}: {len(data['layers'])} layers, {len(workload.tensors)} tensors, "
          f"{workload.total_params:,} parameters; step {step * 1e3:.1f} ms on {kw['device']} "
          f"in {kw['precision']} at MFU {make_profiles.MFU:g}, matmul fraction "
          f"{data['matmul_fraction']}")
    print(f"wrote {out}")
    return 0


def _command(args: argparse.Namespace) -> str:
    """Return the command line that reproduces this profile (for the file's header)."""
    parts = ["ddpbench profile", args.model, f"--batch-size {args.batch_size}",
             f"--device {args.device}"]
    if args.input_shape:
        parts.append("--input-shape " + ",".join(str(d) for d in args.input_shape))
    if args.threads is not None:
        parts.append(f"--threads {args.threads}")
    if args.malloc != "keep":
        parts.append(f"--malloc {args.malloc}")
    parts += [f"--warmup {args.warmup}", f"--repeats {args.repeats}", f"-o {args.output}"]
    return " ".join(parts)


def _compare(this: object, other: object, label: str) -> None:
    from ddpbench import profiling

    diff = profiling.compare_tensors(this, other)
    print(f"tensor list against {label}: " + ("identical" if diff is None else f"differs, {diff}"))
    a, b = profiling.group_times(this), profiling.group_times(other)
    print(f"{'layer group':<24} {'this ms':>10} {label + ' ms':>14} {'ratio':>7}")
    for key in list(a) + [k for k in b if k not in a]:
        x, y = a.get(key), b.get(key)
        ratio = f"{x / y:7.3f}" if x is not None and y else "      -"
        xs = f"{x * 1e3:10.2f}" if x is not None else f"{'-':>10}"
        ys = f"{y * 1e3:14.2f}" if y is not None else f"{'-':>14}"
        print(f"{key:<24} {xs} {ys} {ratio}")


class _Row(dict):
    """A mapping written on one line (a tensor entry)."""


def _dump(data: dict) -> str:
    """Return ``data`` as YAML with one line per tensor, as the shipped profiles are written."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(_Row, lambda d, row: d.represent_mapping(
        "tag:yaml.org,2002:map", dict(row), flow_style=True))
    for layer in data["layers"]:
        layer["tensors"] = [_Row(t) for t in layer["tensors"]]
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, width=200, default_flow_style=None)
