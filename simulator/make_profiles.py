"""Regenerate the shipped workload profiles (``simulator/profiles/*.yaml``).

Run ``python -m simulator.make_profiles`` after changing a source table. Sources, all inside
``simulator/profiles/``:

- ``resnet50_tensors.tsv``, ``vgg19_tensors.tsv``: exact parameter tensors in creation order.
- ``pipedream_resnet50_profile.tsv``, ``pipedream_vgg16_profile.tsv``: per-operator forward
  and backward milliseconds measured by PipeDream's profiler, batch 128, one GPU (the GPU
  model was not recorded).

Operators without parameters (ReLU, pooling, Add, View, Dropout) are folded into the
preceding parametric layer; the ``Input`` operator (data loading) is left out because data
loading overlaps training. ``seq2seq_lstm`` and ``bert_base`` have no measured profile: their
times come from FLOP counts at the speed the ResNet-50 profile shows for the same GPU
(matrix products at the effective FLOP/s of ResNet-50's convolutions; element-wise operators
at the effective memory bandwidth of its BatchNorm layers), so all four profiles stand for
one GPU.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import yaml

PROFILES = Path(__file__).resolve().parent / "profiles"
BATCH_IMAGES = 128
GPU = "the single GPU of PipeDream's published profiles (model not recorded)"
DEVICE = "V100"
"""The device of :data:`ddpbench.hardware.DEVICES` the PipeDream times stand for. PipeDream
(SOSP 2019, section 5.1) ran on V100 clusters (Azure NC24 v3, AWS p3.16xlarge), and the
ResNet-50 profile's 289 images/s at batch 128 in fp32 is a V100's speed (a P100 reaches
219 at batch 64 in TensorFlow's published benchmarks; a Titan X about half a V100)."""


def _matmul_fraction(rows: list[dict[str, str]]) -> float:
    """Return the share of a measured profile's time in convolutions and linear layers."""
    mm = total = 0.0
    for row in rows:
        if row["op"].startswith("Input"):
            continue
        t = float(row["fwd_ms"]) + float(row["bwd_ms"])
        total += t
        if row["op"].startswith(("Conv2d", "Linear")):
            mm += t
    return round(mm / total, 3)


def _read_tsv(name: str) -> list[dict[str, str]]:
    with open(PROFILES / name, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def _fold_ops(rows: list[dict[str, str]]) -> list[dict]:
    """Group PipeDream operators into parametric layers (each with its trailing ops)."""
    layers: list[dict] = []
    for row in rows:
        op = row["op"]
        if op.startswith("Input"):
            continue
        fwd, bwd, params = float(row["fwd_ms"]), float(row["bwd_ms"]), int(float(row["params"]))
        if params > 0:
            layers.append({"op": op, "params": params, "fwd": fwd, "bwd": bwd,
                           "act": float(row["activation_bytes"])})
        else:
            layers[-1]["fwd"] += fwd
            layers[-1]["bwd"] += bwd
    return layers


def _attach_tensors(layers: list[dict], tensors: list[dict[str, str]]) -> list[dict]:
    out, it = [], iter(tensors)
    for layer in layers:
        group, total = [], 0
        while total < layer["params"]:
            t = next(it)
            group.append({"name": t["name"].split("(")[0], "numel": int(t["params"])})
            total += int(t["params"])
        if total != layer["params"]:
            raise ValueError(f"tensors do not match layer {layer['op']}: {total} != {layer['params']}")
        name = str(group[0]["name"]).rsplit(".", 1)[0]
        out.append({"name": name, "fwd_ms": round(layer["fwd"], 4), "bwd_ms": round(layer["bwd"], 4),
                    "tensors": group})
    if next(it, None) is not None:
        raise ValueError("tensors left over after the last layer")
    return out


def _gpu_speed() -> tuple[float, float, float]:
    """Effective matmul FLOP/s, element-wise bytes/s and BN bwd/fwd ratio of the profiled GPU."""
    rows = _read_tsv("pipedream_resnet50_profile.tsv")
    flops = secs = ew_bytes = ew_secs = ew_bwd = 0.0
    prev_act = None
    for row in rows:
        op, fwd, act = row["op"], float(row["fwd_ms"]) / 1e3, float(row["activation_bytes"])
        if op.startswith("Conv2d"):
            m_cin = re.match(r"Conv2d\((\d+)", op)
            m_k = re.search(r"kernel_size=\((\d+), (\d+)\)", op)
            if m_cin is None or m_k is None:
                raise ValueError(f"cannot read a convolution's shape from {op!r}")
            cin = int(m_cin.group(1))
            kh, kw = map(int, m_k.groups())
            flops += 2 * act / 4 * cin * kh * kw
            secs += fwd
        elif op.startswith("Linear"):
            fin, fout = map(int, re.findall(r"features=(\d+)", op))
            flops += 2 * BATCH_IMAGES * fin * fout
            secs += fwd
        elif op.startswith("BatchNorm2d"):
            ew_bytes += 2 * act
            ew_secs += fwd
            ew_bwd += float(row["bwd_ms"]) / 1e3
        prev_act = act
    del prev_act
    return flops / secs, ew_bytes / ew_secs, ew_bwd / ew_secs


FLOPS, EW_BPS, EW_BWD_RATIO = _gpu_speed()


def _times(matmul_flops: float, ew_elems: float) -> tuple[float, float]:
    """Forward and backward ms of a layer from its matmul FLOPs and element-wise elements."""
    ew = 2 * 4 * ew_elems / EW_BPS  # read and write fp32
    mm = matmul_flops / FLOPS
    return round((mm + ew) * 1e3, 4), round((2 * mm + EW_BWD_RATIO * ew) * 1e3, 4)


def _flop_fraction(layers: list[dict], mm_ms: float) -> float:
    """Return the share of a FLOP-derived profile's time in matrix products."""
    total = sum(x["fwd_ms"] + x["bwd_ms"] for x in layers)
    return round(mm_ms / total, 3)


def resnet50() -> dict:
    layers = _attach_tensors(_fold_ops(_read_tsv("pipedream_resnet50_profile.tsv")),
                             _read_tsv("resnet50_tensors.tsv"))
    return {"name": "resnet50", "batch_size": BATCH_IMAGES, "gpu": GPU, "device": DEVICE,
            "matmul_fraction": _matmul_fraction(_read_tsv("pipedream_resnet50_profile.tsv")),
            "notes": "torchvision ResNet-50; times: PipeDream profile, batch 128; parameterless "
                     "operators folded into the preceding layer; Input (data loading) left out.",
            "layers": layers}


def vgg19() -> dict:
    ops = _fold_ops(_read_tsv("pipedream_vgg16_profile.tsv"))
    rows = [r for r in _read_tsv("pipedream_vgg16_profile.tsv") if not r["op"].startswith("Input")]
    # Per VGG-16 conv: its own time plus its ReLU; pools kept apart so they stay at block ends.
    convs: list[list[list[float]]] = []
    pools: list[tuple[float, float]] = []
    block: list[list[float]] = []
    for r in rows:
        op, f, b = r["op"], float(r["fwd_ms"]), float(r["bwd_ms"])
        if op.startswith("Conv2d"):
            block.append([f, b])
        elif op.startswith("ReLU") and block and len(convs) < 5:
            block[-1][0] += f
            block[-1][1] += b
        elif op.startswith("MaxPool"):
            convs.append(block)
            pools.append((f, b))
            block = []
    vgg19_blocks = [2, 2, 4, 4, 4]
    layers19 = []
    for b, n19 in enumerate(vgg19_blocks):
        for j in range(n19):
            f, bw = convs[b][min(j, len(convs[b]) - 1)]
            if j == n19 - 1:
                f, bw = f + pools[b][0], bw + pools[b][1]
            layers19.append({"fwd": f, "bwd": bw})
    fcs = [op for op in ops if op["op"].startswith("Linear")]
    layers19 += [{"fwd": fc["fwd"], "bwd": fc["bwd"]} for fc in fcs]
    tensors = _read_tsv("vgg19_tensors.tsv")
    out = []
    for i, layer in enumerate(layers19):
        w, bias = tensors[2 * i], tensors[2 * i + 1]
        out.append({"name": w["name"].split(".")[0], "fwd_ms": round(layer["fwd"], 4),
                    "bwd_ms": round(layer["bwd"], 4),
                    "tensors": [{"name": t["name"].split("(")[0], "numel": int(t["params"])}
                                for t in (w, bias)]})
    return {"name": "vgg19", "batch_size": BATCH_IMAGES, "gpu": GPU, "device": DEVICE,
            "matmul_fraction": _matmul_fraction(_read_tsv("pipedream_vgg16_profile.tsv")),
            "notes": "VGG-19 with biases; times: PipeDream's VGG-16 profile, batch 128, with the "
                     "three extra VGG-19 convolutions (conv8 256->256, conv12 and conv16 "
                     "512->512) given the times of their same-shaped neighbour (the previous "
                     "conv of the block); ReLU/pool/dropout folded into the preceding layer.",
            "layers": out}


def _lstm(prefix: str, n_in: int, hidden: int) -> list[dict]:
    # MXNet LSTMCell creation order: i2h_weight, h2h_weight, i2h_bias, h2h_bias.
    g = 4 * hidden
    return [{"name": f"{prefix}i2h_weight", "numel": g * n_in},
            {"name": f"{prefix}h2h_weight", "numel": g * hidden},
            {"name": f"{prefix}i2h_bias", "numel": g},
            {"name": f"{prefix}h2h_bias", "numel": g}]


def seq2seq_lstm(vocab: int = 32_000, batch: int = 64, length: int = 50) -> dict:
    h = e = 512
    tok = batch * length
    att_pairs = batch * length * length

    def lstm_cost(n_in: int, hid: int) -> tuple[float, float]:
        return 2 * tok * (n_in + hid) * 4 * hid, tok * 4 * hid * 3

    layers = []

    mm_ms = [0.0]

    def add(name, tensors, mm, ew):
        f, b = _times(mm, ew)
        mm_ms[0] += 3 * mm / FLOPS * 1e3
        layers.append({"name": name, "fwd_ms": f, "bwd_ms": b, "tensors": tensors})

    add("encoder.embed", [{"name": "source_embed_weight", "numel": vocab * e}], 0, tok * e)
    fw, rv = lstm_cost(e, h // 2)
    add("encoder.birnn", _lstm("encoder_birnn_forward_l0_", e, h // 2)
        + _lstm("encoder_birnn_reverse_l0_", e, h // 2), 2 * fw, 2 * rv)
    add("encoder.rnn1", _lstm("encoder_rnn_l1_", h, h), *lstm_cost(h, h))
    add("decoder.embed", [{"name": "target_embed_weight", "numel": vocab * e}], 0, tok * e)
    add("decoder.attention", [{"name": "att_e2h_weight", "numel": h * h},
                              {"name": "att_q2h_weight", "numel": h * h},
                              {"name": "att_h2s_weight", "numel": h}],
        2 * tok * h * h * 2 + 2 * att_pairs * h * 2, att_pairs * h * 2)
    # Input feeding: the first decoder layer reads the embedding and the previous attention.
    add("decoder.rnn0", _lstm("decoder_rnn_l0_", e + h, h), *lstm_cost(e + h, h))
    add("decoder.rnn1", _lstm("decoder_rnn_l1_", h, h), *lstm_cost(h, h))
    add("decoder.hidden", [{"name": "decoder_hidden_weight", "numel": h * 2 * h},
                           {"name": "decoder_hidden_bias", "numel": h}], 2 * tok * 2 * h * h, tok * h)
    add("decoder.output", [{"name": "target_output_weight", "numel": vocab * h},
                           {"name": "target_output_bias", "numel": vocab}],
        2 * tok * h * vocab, tok * vocab * 2)
    return {"name": "seq2seq_lstm", "batch_size": batch, "gpu": GPU, "device": DEVICE,
            "matmul_fraction": _flop_fraction(layers, mm_ms[0]),
            "notes": f"Sockeye-like RNN NMT: source/target vocabulary {vocab:,} each (untied), "
                     "embedding 512, encoder = bi-directional LSTM layer (256 units per direction, "
                     "Sockeye's split) + LSTM layer 512, decoder = 2 LSTM layers of 512 with input "
                     "feeding, MLP attention (512 hidden), attention hidden layer 512, output "
                     f"layer to the vocabulary. Batch {batch} sentence pairs of {length} tokens. "
                     f"Times derived from FLOPs at {FLOPS / 1e12:.2f} TFLOP/s (matmul) and "
                     f"{EW_BPS / 1e9:.0f} GB/s (element-wise), the ResNet-50 profile's effective "
                     "speeds; backward = 2x matmul FLOPs.",
            "layers": layers}


def bert_base(batch: int = 32, seq: int = 128) -> dict:
    h, ff, vocab, nlayers = 768, 3072, 30_522, 12
    tok = batch * seq
    layers = []

    mm_ms = [0.0]

    def add(name, tensors, mm, ew):
        f, b = _times(mm, ew)
        mm_ms[0] += 3 * mm / FLOPS * 1e3
        layers.append({"name": name, "fwd_ms": f, "bwd_ms": b, "tensors": tensors})

    def lin(prefix, n_in, n_out):
        return [{"name": f"{prefix}.weight", "numel": n_in * n_out},
                {"name": f"{prefix}.bias", "numel": n_out}]

    def ln(prefix):
        return [{"name": f"{prefix}.weight", "numel": h}, {"name": f"{prefix}.bias", "numel": h}]

    add("embeddings", [{"name": "embeddings.word_embeddings.weight", "numel": vocab * h},
                       {"name": "embeddings.position_embeddings.weight", "numel": 512 * h},
                       {"name": "embeddings.token_type_embeddings.weight", "numel": 2 * h}]
        + ln("embeddings.LayerNorm"), 0, tok * h * 4)
    for i in range(nlayers):
        p = f"encoder.layer.{i}"
        for part in ("query", "key", "value"):
            add(f"{p}.attention.self.{part}", lin(f"{p}.attention.self.{part}", h, h),
                2 * tok * h * h, tok * h)
        # Scores QK^T and the weighted sum AV (no parameters) run before the output dense.
        add(f"{p}.attention.output.dense", lin(f"{p}.attention.output.dense", h, h),
            2 * tok * h * h + 2 * 2 * tok * seq * h, batch * 12 * seq * seq * 2 + tok * h)
        add(f"{p}.attention.output.LayerNorm", ln(f"{p}.attention.output.LayerNorm"), 0, tok * h * 3)
        add(f"{p}.intermediate.dense", lin(f"{p}.intermediate.dense", h, ff), 2 * tok * h * ff, tok * ff * 2)
        add(f"{p}.output.dense", lin(f"{p}.output.dense", ff, h), 2 * tok * ff * h, tok * h)
        add(f"{p}.output.LayerNorm", ln(f"{p}.output.LayerNorm"), 0, tok * h * 3)
    add("pooler.dense", lin("pooler.dense", h, h), 2 * batch * h * h, batch * h)
    return {"name": "bert_base", "batch_size": batch, "gpu": GPU, "device": DEVICE,
            "matmul_fraction": _flop_fraction(layers, mm_ms[0]),
            "notes": f"BERT-base (HF BertModel, vocabulary {vocab:,}, 12 layers, hidden 768, 12 "
                     "heads, FFN 3072, with pooler, no pre-training heads). Batch "
                     f"{batch} sequences of {seq} tokens. Times derived from FLOPs at "
                     f"{FLOPS / 1e12:.2f} TFLOP/s (matmul) and {EW_BPS / 1e9:.0f} GB/s "
                     "(element-wise), the ResNet-50 profile's effective speeds; backward = 2x "
                     "matmul FLOPs; attention scores folded into attention.output.dense.",
            "layers": layers}


def main() -> None:
    for build in (resnet50, vgg19, seq2seq_lstm, bert_base):
        prof = build()
        params = sum(t["numel"] for layer in prof["layers"] for t in layer["tensors"])
        ntensors = sum(len(layer["tensors"]) for layer in prof["layers"])
        header = (f"# Workload profile {prof['name']}: {ntensors} tensors, {params:,} parameters.\n"
                  "# Generated by `python -m simulator.make_profiles`; edit the generator, not "
                  "this file.\n# Times are milliseconds per iteration at batch_size on the GPU "
                  "named below.\n")
        text = yaml.safe_dump(prof, sort_keys=False, width=100, default_flow_style=None)
        (PROFILES / f"{prof['name']}.yaml").write_text(header + text)
        print(f"{prof['name']}: {len(prof['layers'])} layers, {ntensors} tensors, {params:,} params")


if __name__ == "__main__":
    main()
