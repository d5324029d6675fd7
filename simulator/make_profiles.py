"""Regenerate the shipped workload profiles (``simulator/profiles/*.yaml``).

Run ``python -m ddpbench.simulator.make_profiles`` after changing a source table or a
builder. Each profile records the device its times stand for (:data:`DEVICE`) and the share
of its time in matrix products, which the device rescaling rule needs
(:func:`ddpbench.hardware.compute_factor`). Sources, all inside
``simulator/profiles/``:

- ``resnet50_tensors.tsv``, ``vgg19_tensors.tsv``: exact parameter tensors in creation order.
- ``pipedream_resnet50_profile.tsv``, ``pipedream_vgg16_profile.tsv``: per-operator forward
  and backward milliseconds measured by PipeDream's profiler, batch 128, one GPU (the GPU
  model was not recorded).

Operators without parameters (ReLU, pooling, Add, View, Dropout) are folded into the
preceding parametric layer; the ``Input`` operator (data loading) is left out because data
loading overlaps training. ``vgg16`` is PipeDream's VGG-16 profile itself; ``resnet101`` and
``resnet152`` are ResNet-50's profile with the extra layer2 and layer3 blocks. The others
(``seq2seq_lstm``, ``sockeye``, ``bert_base``, ``bert_large``, ``transformer_big``,
``gpt2_xl``, ``inception_v3``, ``alexnet``) have no measured profile: each is built from its
layer definitions (its source named in its notes), and its times come from FLOP counts at
the speed the ResNet-50 profile shows for the same GPU (matrix products at the effective
FLOP/s of ResNet-50's convolutions; element-wise operators at the effective memory bandwidth
of its BatchNorm layers), so all profiles stand for one GPU.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import yaml

from ddpbench.profiling.llm import LLAMA_VOCAB, LLAMAS, llama_name, llama_vocab

PROFILES = Path(__file__).resolve().parent / "profiles"
BATCH_IMAGES = 128
GPU = ("the single GPU of PipeDream's published profiles (model not recorded; a V100-class "
       "GPU, see DEVICE)")
DEVICE = "pipedream"
"""The device of :data:`ddpbench.hardware.DEVICES` the PipeDream times stand for: PipeDream
(SOSP 2019, section 5.1) ran on V100 clusters (Azure NC24 v3, AWS p3.16xlarge), but the
ResNet-50 profile's 289 images/s at batch 128 in fp32 is below a V100's published speed
(MXNet 1.2: 364), so the table keeps the profiled GPU as a device of its own, measured by
this profile; a point that names ``V100`` runs at the V100's measured speed."""


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
        out.append({"name": w["name"].split("(")[0].rsplit(".", 1)[0], "fwd_ms": round(layer["fwd"], 4),
                    "bwd_ms": round(layer["bwd"], 4),
                    "tensors": [{"name": t["name"].split("(")[0], "numel": int(t["params"])}
                                for t in (w, bias)]})
    return {"name": "vgg19", "batch_size": BATCH_IMAGES, "gpu": GPU, "device": DEVICE,
            "matmul_fraction": _matmul_fraction(_read_tsv("pipedream_vgg16_profile.tsv")),
            "notes": "VGG-19 with biases; times: PipeDream's VGG-16 profile, batch 128, with the "
                     "three extra VGG-19 convolutions (features.16 256->256, features.25 and "
                     "features.34 512->512, the 8th, 12th and 16th) given the times of their "
                     "same-shaped neighbour (the previous conv of the block); ReLU/pool/dropout folded into the preceding layer.",
            "layers": out}


def _lstm(prefix: str, n_in: int, hidden: int) -> list[dict]:
    # MXNet LSTMCell creation order: i2h_weight, h2h_weight, i2h_bias, h2h_bias.
    g = 4 * hidden
    return [{"name": f"{prefix}i2h_weight", "numel": g * n_in},
            {"name": f"{prefix}h2h_weight", "numel": g * hidden},
            {"name": f"{prefix}i2h_bias", "numel": g},
            {"name": f"{prefix}h2h_bias", "numel": g}]


class _Builder:
    """Layers of a profile derived from FLOP counts (at the ResNet-50 profile's speeds)."""

    def __init__(self) -> None:
        self.layers: list[dict] = []
        self.mm_ms = 0.0

    def add(self, name: str, tensors: list[dict], mm: float, ew: float) -> None:
        f, b = _times(mm, ew)
        self.mm_ms += 3 * mm / FLOPS * 1e3
        self.layers.append({"name": name, "fwd_ms": f, "bwd_ms": b, "tensors": tensors})

    def profile(self, name: str, batch: int, notes: str) -> dict:
        return {"name": name, "batch_size": batch, "gpu": GPU, "device": DEVICE,
                "matmul_fraction": _flop_fraction(self.layers, self.mm_ms),
                "notes": notes + f" Times derived from FLOPs at {FLOPS / 1e12:.2f} TFLOP/s "
                f"(matmul) and {EW_BPS / 1e9:.0f} GB/s (element-wise), the ResNet-50 profile's "
                "effective speeds; backward = 2x matmul FLOPs.",
                "layers": self.layers}


def _lin(prefix: str, n_in: int, n_out: int, bias: bool = True) -> list[dict]:
    out = [{"name": f"{prefix}.weight", "numel": n_in * n_out}]
    return out + [{"name": f"{prefix}.bias", "numel": n_out}] if bias else out


def _norm(prefix: str, h: int) -> list[dict]:
    return [{"name": f"{prefix}.weight", "numel": h}, {"name": f"{prefix}.bias", "numel": h}]


def _seq2seq(name: str, *, vocab: int, embed: int, hidden: int, enc_layers: int,
             dec_layers: int, batch: int, length: int, notes: str) -> dict:
    """An RNN encoder-decoder as Sockeye 1.x builds it: the first encoder layer
    bi-directional (hidden/2 per direction), MLP attention, input feeding, a hidden layer."""
    h, e = hidden, embed
    tok = batch * length
    att_pairs = batch * length * length

    def lstm_cost(n_in: int, hid: int) -> tuple[float, float]:
        return 2 * tok * (n_in + hid) * 4 * hid, tok * 4 * hid * 3

    net = _Builder()
    net.add("encoder.embed", [{"name": "source_embed_weight", "numel": vocab * e}], 0, tok * e)
    fw, rv = lstm_cost(e, h // 2)
    net.add("encoder.birnn", _lstm("encoder_birnn_forward_l0_", e, h // 2)
            + _lstm("encoder_birnn_reverse_l0_", e, h // 2), 2 * fw, 2 * rv)
    for i in range(1, enc_layers):
        net.add(f"encoder.rnn{i}", _lstm(f"encoder_rnn_l{i}_", h, h), *lstm_cost(h, h))
    net.add("decoder.embed", [{"name": "target_embed_weight", "numel": vocab * e}], 0, tok * e)
    net.add("decoder.attention", [{"name": "att_e2h_weight", "numel": h * h},
                                  {"name": "att_q2h_weight", "numel": h * h},
                                  {"name": "att_h2s_weight", "numel": h}],
            2 * tok * h * h * 2 + 2 * att_pairs * h * 2, att_pairs * h * 2)
    # Input feeding: the first decoder layer reads the embedding and the previous attention.
    net.add("decoder.rnn0", _lstm("decoder_rnn_l0_", e + h, h), *lstm_cost(e + h, h))
    for i in range(1, dec_layers):
        net.add(f"decoder.rnn{i}", _lstm(f"decoder_rnn_l{i}_", h, h), *lstm_cost(h, h))
    net.add("decoder.hidden", [{"name": "decoder_hidden_weight", "numel": h * 2 * h},
                               {"name": "decoder_hidden_bias", "numel": h}],
            2 * tok * 2 * h * h, tok * h)
    net.add("decoder.output", [{"name": "target_output_weight", "numel": vocab * h},
                               {"name": "target_output_bias", "numel": vocab}],
            2 * tok * h * vocab, tok * vocab * 2)
    return net.profile(name, batch, notes)


def seq2seq_lstm(vocab: int = 32_000, batch: int = 64, length: int = 50) -> dict:
    return _seq2seq(
        "seq2seq_lstm", vocab=vocab, embed=512, hidden=512, enc_layers=2, dec_layers=2,
        batch=batch, length=length,
        notes=f"Sockeye-like RNN NMT: source/target vocabulary {vocab:,} each (untied), "
              "embedding 512, encoder = bi-directional LSTM layer (256 units per direction, "
              "Sockeye's split) + LSTM layer 512, decoder = 2 LSTM layers of 512 with input "
              "feeding, MLP attention (512 hidden), attention hidden layer 512, output "
              f"layer to the vocabulary. Batch {batch} sentence pairs of {length} tokens.")


def sockeye(vocab: int = 50_000, batch: int = 64, length: int = 50) -> dict:
    return _seq2seq(
        "sockeye", vocab=vocab, embed=512, hidden=1024, enc_layers=1, dec_layers=1,
        batch=batch, length=length,
        notes="The P3 paper's Sockeye: Sockeye 1.x's default RNN model (sockeye/arguments.py: "
              "--rnn-num-hidden 1024, --num-embed 512, --num-layers 1 (a bi-directional "
              "encoder layer of 512 units per direction, one decoder layer), MLP attention, "
              f"--batch-size 64 sentences, --num-words 50000 per side: {vocab:,}-word untied "
              f"vocabularies). Batch {batch} sentence pairs of {length} tokens.")


def _bert(name: str, *, h: int, ff: int, nlayers: int, heads: int, vocab: int, batch: int,
          seq: int, notes: str) -> dict:
    tok = batch * seq
    net = _Builder()
    net.add("embeddings", [{"name": "embeddings.word_embeddings.weight", "numel": vocab * h},
                           {"name": "embeddings.position_embeddings.weight", "numel": 512 * h},
                           {"name": "embeddings.token_type_embeddings.weight", "numel": 2 * h}]
            + _norm("embeddings.LayerNorm", h), 0, tok * h * 4)
    for i in range(nlayers):
        p = f"encoder.layer.{i}"
        for part in ("query", "key", "value"):
            net.add(f"{p}.attention.self.{part}", _lin(f"{p}.attention.self.{part}", h, h),
                    2 * tok * h * h, tok * h)
        # Scores QK^T and the weighted sum AV (no parameters) run before the output dense.
        net.add(f"{p}.attention.output.dense", _lin(f"{p}.attention.output.dense", h, h),
                2 * tok * h * h + 2 * 2 * tok * seq * h, batch * heads * seq * seq * 2 + tok * h)
        net.add(f"{p}.attention.output.LayerNorm", _norm(f"{p}.attention.output.LayerNorm", h),
                0, tok * h * 3)
        net.add(f"{p}.intermediate.dense", _lin(f"{p}.intermediate.dense", h, ff),
                2 * tok * h * ff, tok * ff * 2)
        net.add(f"{p}.output.dense", _lin(f"{p}.output.dense", ff, h), 2 * tok * ff * h, tok * h)
        net.add(f"{p}.output.LayerNorm", _norm(f"{p}.output.LayerNorm", h), 0, tok * h * 3)
    net.add("pooler.dense", _lin("pooler.dense", h, h), 2 * batch * h * h, batch * h)
    return net.profile(name, batch, notes + " Attention scores folded into "
                       "attention.output.dense.")


def bert_base(batch: int = 32, seq: int = 128) -> dict:
    return _bert("bert_base", h=768, ff=3072, nlayers=12, heads=12, vocab=30_522, batch=batch,
                 seq=seq, notes="BERT-base (HF BertModel, vocabulary 30,522, 12 layers, hidden "
                 "768, 12 heads, FFN 3072, with pooler, no pre-training heads). Batch "
                 f"{batch} sequences of {seq} tokens.")


# NVIDIA DeepLearningExamples, BERT for PyTorch, README "Pre-training NVIDIA DGX-1 With
# 16G": throughput speedup (FP32 - mixed precision) 3.76, 3.75 and 3.74 on 1, 4 and 8 V100s
# at sequence length 128, the profile's length.
BERT_LARGE_MIXED_SPEEDUP = 3.75


def bert_large(batch: int = 32, seq: int = 128) -> dict:
    prof = _bert("bert_large", h=1024, ff=4096, nlayers=24, heads=16, vocab=30_522,
                 batch=batch, seq=seq, notes="BERT-large (Devlin et al. 2019, section "
                 "3: L=24, H=1024, A=16; HF BertModel, vocabulary 30,522, FFN 4096, with "
                 "pooler, no pre-training heads). Batch "
                 f"{batch} sequences of {seq} tokens (pre-training phase 1 length). Mixed "
                 f"precision trains it {BERT_LARGE_MIXED_SPEEDUP:g}x as fast as fp32 on a V100 (NVIDIA "
                 "DeepLearningExamples, BERT for PyTorch, DGX-1 16G pre-training at sequence "
                 "length 128: 3.74-3.76 on 1 to 8 GPUs).")
    at = list(prof).index("matmul_fraction") + 1
    items = list(prof.items())
    return dict(items[:at] + [("mixed_precision_speedup", BERT_LARGE_MIXED_SPEEDUP)]
                + items[at:])


def transformer_big(vocab: int = 37_000, batch: int = 128, length: int = 25) -> dict:
    d, ff, heads, nlayers = 1024, 4096, 16, 6
    tok = batch * length
    net = _Builder()

    def attention(p: str, kv_len: int) -> None:
        for part in ("q_proj", "k_proj", "v_proj"):
            net.add(f"{p}.{part}", _lin(f"{p}.{part}", d, d), 2 * tok * d * d, tok * d)
        net.add(f"{p}.out_proj", _lin(f"{p}.out_proj", d, d),
                2 * tok * d * d + 2 * 2 * tok * kv_len * d,
                batch * heads * length * kv_len * 2 + tok * d)

    def block_end(p: str, names: tuple[str, ...]) -> None:
        net.add(f"{p}.fc1", _lin(f"{p}.fc1", d, ff), 2 * tok * d * ff, tok * ff * 2)
        net.add(f"{p}.fc2", _lin(f"{p}.fc2", ff, d), 2 * tok * ff * d, tok * d)
        for n in names:
            net.add(f"{p}.{n}", _norm(f"{p}.{n}", d), 0, tok * d * 3)

    # One embedding matrix shared by source, target and the pre-softmax projection.
    net.add("embed_tokens", [{"name": "embed_tokens.weight", "numel": vocab * d}], 0, 2 * tok * d)
    for i in range(nlayers):
        p = f"encoder.layers.{i}"
        attention(f"{p}.self_attn", length)
        net.add(f"{p}.self_attn_layer_norm", _norm(f"{p}.self_attn_layer_norm", d), 0, tok * d * 3)
        block_end(p, ("final_layer_norm",))
    for i in range(nlayers):
        p = f"decoder.layers.{i}"
        attention(f"{p}.self_attn", length)
        net.add(f"{p}.self_attn_layer_norm", _norm(f"{p}.self_attn_layer_norm", d), 0, tok * d * 3)
        attention(f"{p}.encoder_attn", length)
        net.add(f"{p}.encoder_attn_layer_norm", _norm(f"{p}.encoder_attn_layer_norm", d), 0,
                tok * d * 3)
        block_end(p, ("final_layer_norm",))
    net.add("output_projection", [], 2 * tok * d * vocab, tok * vocab * 2)
    return net.profile("transformer_big", batch,
                       "Transformer (big) for NMT (Vaswani et al. 2017, Table 3: N=6, "
                       "d_model=1024, d_ff=4096, h=16; a shared source-target BPE vocabulary "
                       f"of about 37,000 tokens, one matrix for both embeddings and the "
                       "pre-softmax projection, sinusoidal positions; fairseq's parameter "
                       f"names). Batch {batch} sentence pairs of {length} tokens (the paper's "
                       "25,000 source + 25,000 target tokens per 8 GPUs is ~3,100 per GPU).")


def gpt2_xl(batch: int = 4, seq: int = 1024) -> dict:
    d, heads, nlayers, vocab, ctx = 1600, 25, 48, 50_257, 1024
    tok = batch * seq
    net = _Builder()
    net.add("transformer.wte", [{"name": "transformer.wte.weight", "numel": vocab * d},
                                {"name": "transformer.wpe.weight", "numel": ctx * d}],
            0, tok * d * 2)
    for i in range(nlayers):
        p = f"transformer.h.{i}"
        net.add(f"{p}.ln_1", _norm(f"{p}.ln_1", d), 0, tok * d * 3)
        net.add(f"{p}.attn.c_attn", _lin(f"{p}.attn.c_attn", d, 3 * d), 2 * tok * d * 3 * d,
                tok * 3 * d)
        net.add(f"{p}.attn.c_proj", _lin(f"{p}.attn.c_proj", d, d),
                2 * tok * d * d + 2 * 2 * tok * seq * d, batch * heads * seq * seq * 3 + tok * d)
        net.add(f"{p}.ln_2", _norm(f"{p}.ln_2", d), 0, tok * d * 3)
        net.add(f"{p}.mlp.c_fc", _lin(f"{p}.mlp.c_fc", d, 4 * d), 2 * tok * d * 4 * d,
                tok * 4 * d * 2)
        net.add(f"{p}.mlp.c_proj", _lin(f"{p}.mlp.c_proj", 4 * d, d), 2 * tok * 4 * d * d,
                tok * d)
    net.add("transformer.ln_f", _norm("transformer.ln_f", d), 0, tok * d * 3)
    net.add("lm_head", [], 2 * tok * d * vocab, tok * vocab * 2)
    return net.profile("gpt2_xl", batch,
                       "GPT-2 1.5B (Radford et al. 2019, Table 2: 48 layers, d_model 1600; HF "
                       "GPT2Model names: 25 heads, vocabulary 50,257, context 1024, LM head "
                       f"tied to wte). Batch {batch} sequences of {seq} tokens; fp32 on one "
                       "device, as every profile here (it would not fit a 16 GB V100: the "
                       "times are a compute model, not a measurement).")


class _Cnn(_Builder):
    """Convolutions (no bias) each followed by a BatchNorm layer, as torchvision builds them."""

    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch = batch

    def conv_bn(self, name: str, cin: int, cout: int, k: tuple[int, int], out: int) -> None:
        flops = 2 * self.batch * out * out * cin * cout * k[0] * k[1]
        self.add(f"{name}.conv", [{"name": f"{name}.conv.weight",
                                   "numel": cout * cin * k[0] * k[1]}], flops, 0)
        # BatchNorm then ReLU: read and write the activation a few times.
        self.add(f"{name}.bn", _norm(f"{name}.bn", cout), 0, self.batch * cout * out * out * 3)


def inception_v3(batch: int = 64) -> dict:
    net = _Cnn(batch)
    c = net.conv_bn
    c("Conv2d_1a_3x3", 3, 32, (3, 3), 149)
    c("Conv2d_2a_3x3", 32, 32, (3, 3), 147)
    c("Conv2d_2b_3x3", 32, 64, (3, 3), 147)
    c("Conv2d_3b_1x1", 64, 80, (1, 1), 73)
    c("Conv2d_4a_3x3", 80, 192, (3, 3), 71)
    for name, cin, pool in (("Mixed_5b", 192, 32), ("Mixed_5c", 256, 64), ("Mixed_5d", 288, 64)):
        c(f"{name}.branch1x1", cin, 64, (1, 1), 35)
        c(f"{name}.branch5x5_1", cin, 48, (1, 1), 35)
        c(f"{name}.branch5x5_2", 48, 64, (5, 5), 35)
        c(f"{name}.branch3x3dbl_1", cin, 64, (1, 1), 35)
        c(f"{name}.branch3x3dbl_2", 64, 96, (3, 3), 35)
        c(f"{name}.branch3x3dbl_3", 96, 96, (3, 3), 35)
        c(f"{name}.branch_pool", cin, pool, (1, 1), 35)
    c("Mixed_6a.branch3x3", 288, 384, (3, 3), 17)
    c("Mixed_6a.branch3x3dbl_1", 288, 64, (1, 1), 35)
    c("Mixed_6a.branch3x3dbl_2", 64, 96, (3, 3), 35)
    c("Mixed_6a.branch3x3dbl_3", 96, 96, (3, 3), 17)
    for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        c(f"{name}.branch1x1", 768, 192, (1, 1), 17)
        c(f"{name}.branch7x7_1", 768, c7, (1, 1), 17)
        c(f"{name}.branch7x7_2", c7, c7, (1, 7), 17)
        c(f"{name}.branch7x7_3", c7, 192, (7, 1), 17)
        c(f"{name}.branch7x7dbl_1", 768, c7, (1, 1), 17)
        c(f"{name}.branch7x7dbl_2", c7, c7, (7, 1), 17)
        c(f"{name}.branch7x7dbl_3", c7, c7, (1, 7), 17)
        c(f"{name}.branch7x7dbl_4", c7, c7, (7, 1), 17)
        c(f"{name}.branch7x7dbl_5", c7, 192, (1, 7), 17)
        c(f"{name}.branch_pool", 768, 192, (1, 1), 17)
    c("AuxLogits.conv0", 768, 128, (1, 1), 5)
    c("AuxLogits.conv1", 128, 768, (5, 5), 1)
    net.add("AuxLogits.fc", _lin("AuxLogits.fc", 768, 1000), 2 * batch * 768 * 1000, batch * 1000)
    c("Mixed_7a.branch3x3_1", 768, 192, (1, 1), 17)
    c("Mixed_7a.branch3x3_2", 192, 320, (3, 3), 8)
    c("Mixed_7a.branch7x7x3_1", 768, 192, (1, 1), 17)
    c("Mixed_7a.branch7x7x3_2", 192, 192, (1, 7), 17)
    c("Mixed_7a.branch7x7x3_3", 192, 192, (7, 1), 17)
    c("Mixed_7a.branch7x7x3_4", 192, 192, (3, 3), 8)
    for name, cin in (("Mixed_7b", 1280), ("Mixed_7c", 2048)):
        c(f"{name}.branch1x1", cin, 320, (1, 1), 8)
        c(f"{name}.branch3x3_1", cin, 384, (1, 1), 8)
        c(f"{name}.branch3x3_2a", 384, 384, (1, 3), 8)
        c(f"{name}.branch3x3_2b", 384, 384, (3, 1), 8)
        c(f"{name}.branch3x3dbl_1", cin, 448, (1, 1), 8)
        c(f"{name}.branch3x3dbl_2", 448, 384, (3, 3), 8)
        c(f"{name}.branch3x3dbl_3a", 384, 384, (1, 3), 8)
        c(f"{name}.branch3x3dbl_3b", 384, 384, (3, 1), 8)
        c(f"{name}.branch_pool", cin, 192, (1, 1), 8)
    net.add("fc", _lin("fc", 2048, 1000), 2 * batch * 2048 * 1000, batch * 1000)
    return net.profile("inception_v3", batch,
                       "torchvision Inception-v3 (Szegedy et al. 2016) at 299x299, with the "
                       "auxiliary classifier that training runs; every BasicConv2d is a "
                       "convolution without bias then BatchNorm (weight, bias). Batch "
                       f"{batch} images.")


def vgg16() -> dict:
    rows = _read_tsv("pipedream_vgg16_profile.tsv")
    names = [f"features.{i}" for i in (0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28)]
    names += [f"classifier.{i}" for i in (0, 3, 6)]
    out = []
    for name, layer in zip(names, _fold_ops(rows), strict=True):
        m = re.match(r"Conv2d\(\d+, (\d+)", layer["op"]) or re.search(r"out_features=(\d+)",
                                                                    layer["op"])
        if m is None:
            raise ValueError(f"cannot read the output width of {layer['op']!r}")
        bias = int(m.group(1))
        out.append({"name": name, "fwd_ms": round(layer["fwd"], 4),
                    "bwd_ms": round(layer["bwd"], 4),
                    "tensors": [{"name": f"{name}.weight", "numel": layer["params"] - bias},
                                {"name": f"{name}.bias", "numel": bias}]})
    return {"name": "vgg16", "batch_size": BATCH_IMAGES, "gpu": GPU, "device": DEVICE,
            "matmul_fraction": _matmul_fraction(rows),
            "notes": "torchvision VGG-16 with biases; times: PipeDream's VGG-16 profile, batch "
                     "128, ReLU/pool/dropout folded into the preceding layer; tensors from each "
                     "layer's parameter count (weight = count - output width, bias = output "
                     "width).",
            "layers": out}


def _deeper(layers: list[dict], stage: str, last: int, blocks: int) -> list[dict]:
    """Return ResNet-50's ``layers`` with ``stage`` grown to ``blocks`` bottleneck blocks:
    blocks after a stage's first have one shape, so each new one takes the measured times of
    the stage's last block (``{stage}.{last}``)."""
    old = f"{stage}.{last}."
    template = [x for x in layers if x["name"].startswith(old)]
    at = max(i for i, x in enumerate(layers) if x["name"].startswith(old)) + 1
    extra = []
    for b in range(last + 1, blocks):
        new = f"{stage}.{b}."
        for x in template:
            extra.append({**x, "name": x["name"].replace(old, new),
                          "tensors": [{**t, "name": t["name"].replace(old, new)}
                                      for t in x["tensors"]]})
    return layers[:at] + extra + layers[at:]


def resnet101() -> dict:
    base = resnet50()
    # ResNet-101 is ResNet-50 with 23 bottleneck blocks in layer3 instead of 6.
    return {**base, "name": "resnet101", "layers": _deeper(base["layers"], "layer3", 5, 23),
            "notes": "torchvision ResNet-101: ResNet-50's layers and PipeDream times (batch 128) "
                     "with 17 more layer3 bottleneck blocks (layer3.6 to layer3.22), each given "
                     "the measured times of layer3.5, the same shapes."}


def resnet152() -> dict:
    base = resnet50()
    # ResNet-152 is ResNet-50 with 8 bottleneck blocks in layer2 (not 4) and 36 in layer3
    # (not 6): torchvision's resnet152, Bottleneck with layers [3, 8, 36, 3].
    layers = _deeper(_deeper(base["layers"], "layer2", 3, 8), "layer3", 5, 36)
    return {**base, "name": "resnet152", "layers": layers,
            "notes": "torchvision ResNet-152: ResNet-50's layers and PipeDream times (batch 128) "
                     "with 4 more layer2 bottleneck blocks (layer2.4 to layer2.7), each given "
                     "the measured times of layer2.3, and 30 more layer3 blocks (layer3.6 to "
                     "layer3.35), each given those of layer3.5, the same shapes."}


def alexnet(batch: int = BATCH_IMAGES) -> dict:
    net = _Builder()
    # torchvision's AlexNet (the "one weird trick" variant): convolutions with biases, each
    # followed by ReLU (and some by max-pooling, folded in), at 224x224.
    convs = (("features.0", 3, 64, 11, 55), ("features.3", 64, 192, 5, 27),
             ("features.6", 192, 384, 3, 13), ("features.8", 384, 256, 3, 13),
             ("features.10", 256, 256, 3, 13))
    for name, cin, cout, k, out in convs:
        net.add(name, [{"name": f"{name}.weight", "numel": cout * cin * k * k},
                       {"name": f"{name}.bias", "numel": cout}],
                2 * batch * out * out * cin * cout * k * k, batch * cout * out * out)
    for name, n_in, n_out in (("classifier.1", 256 * 6 * 6, 4096), ("classifier.4", 4096, 4096),
                              ("classifier.6", 4096, 1000)):
        net.add(name, _lin(name, n_in, n_out), 2 * batch * n_in * n_out, batch * n_out)
    return net.profile("alexnet", batch,
                       "torchvision AlexNet (Krizhevsky 2014, 'One weird trick', the variant "
                       "torchvision builds) at 224x224: five convolutions and three linear "
                       "layers with biases; ReLU, max-pooling and dropout folded into the "
                       f"preceding layer. Batch {batch} images.")


# -- workloads of today: decoder-only transformers and ViT-L, at a device's bf16 peak --------

LLM_DEVICE, LLM_PRECISION = "H100", "bf16"
"""The device and precision the transformer profiles below stand for (a point rescales them
to its own by the device and precision rules of :mod:`ddpbench.hardware`)."""

MFU = 0.47
"""Achievable model FLOP utilisation of a training step: NVIDIA/Megatron-LM's README
("up to 47% Model FLOP Utilization (MFU) on H100 clusters", GPT models of 2B to 462B
parameters at sequence length 4096, bf16). One constant for every profile built here: a
step's time is its model FLOPs over ``MFU x`` the device's dense peak at the profile's
precision. It is the best figure Megatron-LM reports, communication included, so for one
device's compute alone it errs on the slow side of what the kernels reach. It is a bf16
figure: a profile generated at another precision applies it to that precision's peak (at
fp8, optimistic); the shipped profiles are bf16 and a point's ``precision`` rescales them
by :func:`ddpbench.hardware.precision_factor` instead."""

# Llama-style decoder-only transformers: their shapes and sources are
# ddpbench.profiling.llm's LLAMAS (which also builds them as torch modules to measure).
LLAMA_SEQ_LEN, LLAMA_MICRO_BATCH = 4096, 1  # Llama 2's context length; one sequence
LLAMA3_SEQ_LEN = 8192  # Llama 3's context length (config.json max_position_embeddings)


def llama_seq_len(size: str) -> int:
    """Return the default sequence length of Llama size ``size``: its context length."""
    return LLAMA3_SEQ_LEN if size.startswith("3_") else LLAMA_SEQ_LEN


class _Roofline:
    """Layers of a profile from FLOPs and element-wise bytes at a device's peaks.

    A layer's forward takes ``mm / F + ew x B / M`` (its matrix-product FLOPs at the dense
    peak ``F`` of the precision, its element-wise elements read or written at ``B`` bytes
    each over the memory bandwidth ``M``), its backward twice that; then every time is
    scaled so that the step takes its model FLOPs (3 x the forward matrix products) over
    :data:`MFU` x ``F``. The matmul fraction is the matrix products' share at the peaks.
    """

    def __init__(self, device: str, precision: str) -> None:
        from ddpbench import hardware

        dev = hardware.device(device)
        if precision not in hardware.ACTIVATION_BYTES:
            raise ValueError(f"unknown precision {precision!r}; known: "
                             f"{list(hardware.ACTIVATION_BYTES)}")
        peak = dev.peak_tflops(precision)
        if peak is None:
            have = [d.name for d in hardware.DEVICES.values() if d.peak_tflops(precision)]
            raise ValueError(f"precision {precision!r}: device {device!r} has no {precision} "
                             f"arithmetic; devices with it: {have}")
        self.device, self.precision = device, precision
        self.flops, self.bps = peak * 1e12, dev.mem_gbps * 1e9
        self.nbytes = hardware.ACTIVATION_BYTES[precision]
        self.raw: list[tuple[str, list[dict], float, float]] = []

    def add(self, name: str, tensors: list[dict], mm: float, ew: float) -> None:
        """Add a layer of ``mm`` forward matrix-product FLOPs and ``ew`` element-wise elements."""
        self.raw.append((name, tensors, mm, ew))

    @property
    def model_flops(self) -> float:
        """Training FLOPs of one step: 3 x the forward matrix products (forward, and the
        backward's two products per forward one)."""
        return 3 * sum(mm for _, _, mm, _ in self.raw)

    def profile(self, name: str, batch: int, notes: str, seq_len: int | None) -> dict:
        t_mm = sum(3 * mm / self.flops for _, _, mm, _ in self.raw)
        t_ew = sum(3 * ew * self.nbytes / self.bps for _, _, _, ew in self.raw)
        scale = self.model_flops / (MFU * self.flops) / (t_mm + t_ew)
        layers = []
        for lname, tensors, mm, ew in self.raw:
            fwd = (mm / self.flops + ew * self.nbytes / self.bps) * scale * 1e3
            layers.append({"name": lname, "fwd_ms": float(f"{fwd:.6g}"),
                           "bwd_ms": float(f"{2 * fwd:.6g}"), "tensors": tensors})
        prof: dict = {"name": name, "batch_size": batch,
                      "gpu": f"{self.device}, {self.precision} (a compute model at MFU {MFU:g})",
                      "device": self.device, "matmul_fraction": round(t_mm / (t_mm + t_ew), 3),
                      "precision": self.precision}
        if seq_len is not None:
            prof["seq_len"] = seq_len
        prof["notes"] = (notes + f" Times: the step's model FLOPs ({self.model_flops:.4g} per "
                         f"iteration) at MFU {MFU:g} of the {self.device}'s dense "
                         f"{self.precision} peak (Megatron-LM's reported MFU), split over "
                         "layers by their matrix products at that peak and element-wise "
                         "bytes at its memory bandwidth; backward = 2x forward.")
        prof["layers"] = layers
        return prof


def llama_params(hidden: int, inter: int, layers: int, heads: int, kv_heads: int,
                 vocab: int = LLAMA_VOCAB) -> int:
    """Return a Llama-style model's parameters in closed form: embeddings and an untied
    lm_head (``2 V h``), per layer the attention (``2 h^2 + 2 h kv d``, ``d = h / heads``),
    the gated MLP (``3 h f``) and two RMSNorms (``2 h``), and the final norm."""
    kv = kv_heads * (hidden // heads)
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden
    return 2 * vocab * hidden + layers * per_layer + hidden


def llama_flops_per_token(hidden: int, inter: int, layers: int, heads: int, kv_heads: int,
                          seq_len: int, vocab: int = LLAMA_VOCAB) -> float:
    """Return training FLOPs per token in closed form: ``6 N_mm + 12 L h s``, ``N_mm`` the
    parameters of the matrix products (every linear weight and lm_head; not the embedding
    lookup or the norms) and ``12 L h s`` the attention's scores and weighted sums over the
    full ``s`` x ``s`` (PaLM, Chowdhery et al. 2022, appendix B)."""
    n_mm = llama_params(hidden, inter, layers, heads, kv_heads, vocab) - vocab * hidden \
        - (2 * layers + 1) * hidden
    return 6 * n_mm + 12 * layers * hidden * seq_len


def llama(size: str, seq_len: int | None = None, micro_batch: int = LLAMA_MICRO_BATCH,
          device: str = LLM_DEVICE, precision: str = LLM_PRECISION) -> dict:
    """Return the profile of Llama-style ``size`` (a key of :data:`LLAMAS`) for ``micro_batch``
    sequences of ``seq_len`` tokens per worker (default: the model's context length,
    :func:`llama_seq_len`): one layer per decoder layer, one tensor per weight (Hugging Face
    LlamaForCausalLM's names and creation order), at the model's vocabulary."""
    if size not in LLAMAS:
        raise ValueError(f"unknown Llama size {size!r}; known: {sorted(LLAMAS)}")
    seq_len = llama_seq_len(size) if seq_len is None else seq_len
    if seq_len < 1 or micro_batch < 1:
        raise ValueError(f"seq_len and micro_batch must be >= 1, got {seq_len} and {micro_batch}")
    h, ff, nlayers, heads, kv_heads = LLAMAS[size]
    kv, v, tok = kv_heads * (h // heads), llama_vocab(size), micro_batch * seq_len
    net = _Roofline(device, precision)
    net.add("model.embed_tokens", [{"name": "model.embed_tokens.weight", "numel": v * h}],
            0, tok * h * 2)
    for i in range(nlayers):
        p = f"model.layers.{i}"
        tensors = [{"name": f"{p}.self_attn.{n}_proj.weight", "numel": h * (kv if n in "kv" else h)}
                   for n in ("q", "k", "v", "o")]
        tensors += [{"name": f"{p}.mlp.{n}_proj.weight", "numel": h * ff}
                    for n in ("gate", "up", "down")]
        tensors += [{"name": f"{p}.{n}.weight", "numel": h}
                    for n in ("input_layernorm", "post_attention_layernorm")]
        mm = 2 * tok * (2 * h * h + 2 * h * kv + 3 * h * ff) + 4 * tok * seq_len * h
        # Two RMSNorms, rotary embeddings of q and k, the SiLU gate, two residual adds, and
        # the attention kernel's inputs and output (a fused attention: no s x s scores).
        ew = tok * (4 * h + 2 * (h + kv) + 3 * ff + 6 * h + 2 * (h + kv))
        net.add(p, tensors, mm, ew)
    net.add("model.norm", [{"name": "model.norm.weight", "numel": h}], 0, tok * h * 2)
    net.add("lm_head", [{"name": "lm_head.weight", "numel": v * h}], 2 * tok * h * v, tok * v * 3)
    n = llama_params(h, ff, nlayers, heads, kv_heads, v)
    return net.profile(llama_name(size), micro_batch,
                       f"Llama-style decoder-only transformer, {n / 1e9:.2f}B parameters "
                       f"(hidden {h}, intermediate {ff}, {nlayers} layers, {heads} heads, "
                       f"{kv_heads} key-value heads, vocabulary {v}, untied lm_head; sources in "
                       "ddpbench/profiling/llm.py LLAMAS). Batch: "
                       f"{micro_batch} sequence(s) of {seq_len} tokens per worker.", seq_len)


MPTS: dict[str, tuple[int, int, int]] = {
    "7b": (4096, 32, 32),
    "13b": (5120, 40, 40),
    "70b": (8192, 80, 64),
}
"""MosaicML's MPT decoders as llm-foundry's pretraining configs define them
(mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-{7b,13b,70b}.yaml: ``d_model``,
``n_layers``, ``n_heads``; ``expansion_ratio: 4``, ``vocab_size: 50368``, ``max_seq_len:
2048``), with MPTConfig's defaults for the rest (llmfoundry/models/mpt/configuration_mpt.py:
``no_bias``, ``learned_pos_emb``, tied input and output embeddings): (d_model, layers,
heads)."""
MPT_VOCAB, MPT_SEQ_LEN, MPT_EXPANSION = 50_368, 2048, 4


def mpt_params(d: int, layers: int, vocab: int = MPT_VOCAB, seq_len: int = MPT_SEQ_LEN) -> int:
    """Return an MPT model's parameters in closed form: the tied token embedding (``V d``),
    the learned position embedding (``s d``), per block the fused ``Wqkv`` and ``out_proj``
    (``4 d^2``), the ungated MLP (``2 x 4 d^2``) and two bias-free LayerNorms (``2 d``), and
    the final norm."""
    return vocab * d + seq_len * d + layers * (12 * d * d + 2 * d) + d


def mpt(size: str, seq_len: int = MPT_SEQ_LEN, micro_batch: int = 1,
        device: str = LLM_DEVICE, precision: str = LLM_PRECISION) -> dict:
    """Return the profile of MPT ``size`` (a key of :data:`MPTS`) for ``micro_batch``
    sequences of ``seq_len`` tokens per worker: one layer per block, one tensor per weight
    (llm-foundry's MPTForCausalLM names: ``transformer.blocks.i.attn.Wqkv``, ...)."""
    if size not in MPTS:
        raise ValueError(f"unknown MPT size {size!r}; known: {sorted(MPTS)}")
    if not 1 <= seq_len <= MPT_SEQ_LEN or micro_batch < 1:
        raise ValueError(f"seq_len must be in [1, {MPT_SEQ_LEN}] (the configs' max_seq_len) and "
                         f"micro_batch >= 1, got {seq_len} and {micro_batch}")
    d, nlayers, heads = MPTS[size]
    ff, v, tok = MPT_EXPANSION * d, MPT_VOCAB, micro_batch * seq_len
    net = _Roofline(device, precision)
    net.add("transformer.embed", [{"name": "transformer.wte.weight", "numel": v * d},
                                  {"name": "transformer.wpe.weight", "numel": MPT_SEQ_LEN * d}],
            0, tok * d * 3)
    for i in range(nlayers):
        p = f"transformer.blocks.{i}"
        tensors = [{"name": f"{p}.norm_1.weight", "numel": d},
                   {"name": f"{p}.attn.Wqkv.weight", "numel": 3 * d * d},
                   {"name": f"{p}.attn.out_proj.weight", "numel": d * d},
                   {"name": f"{p}.norm_2.weight", "numel": d},
                   {"name": f"{p}.ffn.up_proj.weight", "numel": d * ff},
                   {"name": f"{p}.ffn.down_proj.weight", "numel": ff * d}]
        mm = 2 * tok * (4 * d * d + 2 * d * ff) + 4 * tok * seq_len * d
        # Two LayerNorms, GeLU, two residual adds, the attention kernel's inputs and output.
        ew = tok * (4 * d + 2 * ff + 6 * d + 4 * d)
        net.add(p, tensors, mm, ew)
    # The tied lm_head reuses wte's weight: its product is counted, its tensor is not again.
    net.add("transformer.norm_f", [{"name": "transformer.norm_f.weight", "numel": d}],
            2 * tok * d * v, tok * (d * 2 + v * 3))
    n = mpt_params(d, nlayers)
    return net.profile(f"mpt_{size}", micro_batch,
                       f"MPT decoder-only transformer, {n / 1e9:.2f}B parameters (d_model {d}, "
                       f"{nlayers} layers, {heads} heads, MLP {ff} ungated GeLU, vocabulary {v} "
                       "tied to the output, learned positions, no biases; sources in "
                       "make_profiles.MPTS). Batch: "
                       f"{micro_batch} sequence(s) of {seq_len} tokens per worker.", seq_len)


VIT_L = (1024, 4096, 24, 16, 16, 224)  # hidden, MLP, layers, heads, patch, image side
"""ViT-L/16 (Dosovitskiy et al. 2021, Table 1: 24 layers, hidden 1024, MLP 4096, 16 heads),
at 224 x 224 with a 1000-class head, as torchvision's vit_l_16 builds it (its parameter
names and order, so ``ddpbench profile torchvision:vit_l_16 --compare vit_l`` lines up)."""


def vit_l(batch: int = 64, device: str = LLM_DEVICE, precision: str = LLM_PRECISION) -> dict:
    """Return the ViT-L/16 profile at ``batch`` images of 224 x 224 per worker."""
    h, ff, nlayers, heads, patch, side = VIT_L
    seq = (side // patch) ** 2 + 1
    tok = batch * seq
    net = _Roofline(device, precision)
    net.add("conv_proj", [{"name": "class_token", "numel": h},
                          {"name": "conv_proj.weight", "numel": 3 * patch * patch * h},
                          {"name": "conv_proj.bias", "numel": h},
                          {"name": "encoder.pos_embedding", "numel": seq * h}],
            2 * batch * (seq - 1) * 3 * patch * patch * h, batch * 3 * side * side + tok * h)
    for i in range(nlayers):
        p = f"encoder.layers.encoder_layer_{i}"
        tensors = _norm(f"{p}.ln_1", h) + [
            {"name": f"{p}.self_attention.in_proj_weight", "numel": 3 * h * h},
            {"name": f"{p}.self_attention.in_proj_bias", "numel": 3 * h}] \
            + _lin(f"{p}.self_attention.out_proj", h, h) + _norm(f"{p}.ln_2", h) \
            + _lin(f"{p}.mlp.0", h, ff) + _lin(f"{p}.mlp.3", ff, h)
        mm = 2 * tok * (4 * h * h + 2 * h * ff) + 4 * tok * seq * h
        # Two LayerNorms, the softmax over every head's scores, GELU, two residual adds.
        ew = tok * (4 * h + 3 * heads * seq + 2 * ff + 6 * h)
        net.add(p, tensors, mm, ew)
    net.add("heads", _norm("encoder.ln", h) + _lin("heads.head", h, 1000),
            2 * batch * h * 1000, tok * h * 2)
    return net.profile("vit_l", batch, "ViT-L/16 at 224 x 224 (197 tokens), 1000 classes; "
                       f"batch {batch} images per worker.", None)


def main() -> None:
    for build in (resnet50, vgg19, seq2seq_lstm, bert_base, vgg16, resnet101, inception_v3,
                  transformer_big, bert_large, gpt2_xl, sockeye, resnet152, alexnet, *_TODAY):
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


_TODAY = (lambda: llama("1b"), lambda: llama("7b"), lambda: llama("13b"), lambda: llama("70b"),
          lambda: llama("3_8b"), lambda: llama("3_70b"), vit_l, lambda: mpt("7b"),
          lambda: mpt("13b"), lambda: mpt("70b"))


if __name__ == "__main__":
    main()
