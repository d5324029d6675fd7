"""Workloads of today: Llama-style decoder-only transformers and ViT-L, generated from their
layer definitions (simulator/make_profiles.py), against closed forms and published counts."""

from __future__ import annotations

import pytest
import yaml

from ddpbench import hardware
from ddpbench.cli import main as cli_main
from ddpbench.profiling.llm import LLAMAS, llama_name, llama_size, llama_vocab
from ddpbench.simulator import make_profiles, simulate
from ddpbench.simulator.workload import Workload, load_workload

# Published parameter counts: Llama 2 (Touvron et al. 2023, Table 1) 7B, 13B, 70B as the HF
# checkpoints hold them (6.74B, 13.0B, 69.0B); TinyLlama 1.1B; ViT-L/16 304M (torchvision's
# ViT_L_16_Weights num_params 304,326,632); Llama 3 8B and 70B (the Llama 3 Herd of Models,
# 2024; the HF checkpoints' 8,030,261,248 and 70,553,706,496).
PUBLISHED = {"llama_1b": 1.1e9, "llama_7b": 6.74e9, "llama_13b": 13.0e9, "llama_70b": 69.0e9,
             "llama3_8b": 8.030261248e9, "llama3_70b": 70.553706496e9, "vit_l": 304e6}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_are_within_one_percent_of_the_published(name):
    wl = load_workload(name)
    assert wl.total_params == pytest.approx(PUBLISHED[name], rel=0.01)
    assert (wl.device, wl.precision) == (make_profiles.LLM_DEVICE, make_profiles.LLM_PRECISION)
    # products dominate; element-wise the rest (ViT-L's unfused softmax over 197 x 197)
    assert (0.5 if name == "vit_l" else 0.8) < wl.matmul_fraction < 0.95
    names = [t.name for t in wl.tensors]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("size", sorted(LLAMAS))
def test_llama_parameters_and_tensors_in_closed_form(size):
    h, ff, layers, heads, kv_heads = LLAMAS[size]
    vocab = llama_vocab(size)
    assert llama_size(llama_name(size)) == size
    wl = load_workload(llama_name(size))
    assert wl.total_params == make_profiles.llama_params(h, ff, layers, heads, kv_heads, vocab)
    # one tensor per weight: 9 per decoder layer, the embedding, the final norm, lm_head
    assert len(wl.tensors) == 9 * layers + 3
    assert len(wl.layers) == layers + 3
    assert wl.tensors[0].numel == wl.tensors[-1].numel == vocab * h  # untied lm_head
    assert wl.seq_len == (8192 if size.startswith("3_") else 4096)  # the context length
    if kv_heads == 8:  # grouped-query attention: k and v project to 8 heads of 128
        k = next(t for t in wl.tensors if t.name == "model.layers.0.self_attn.k_proj.weight")
        assert k.numel == h * 8 * 128


@pytest.mark.parametrize("size", sorted(LLAMAS))
@pytest.mark.parametrize("seq_len,micro_batch", [(4096, 1), (2048, 2), (512, 3)])
def test_a_step_is_its_model_flops_at_the_stated_mfu(size, seq_len, micro_batch):
    """FLOPs per token ~ 6N plus the attention (12 L h s), in closed form; the step's time is
    those FLOPs over MFU x the device's dense bf16 peak."""
    h, ff, layers, heads, kv_heads = LLAMAS[size]
    prof = make_profiles.llama(size, seq_len=seq_len, micro_batch=micro_batch)
    wl = Workload.from_dict(prof)
    vocab = llama_vocab(size)
    per_token = make_profiles.llama_flops_per_token(h, ff, layers, heads, kv_heads, seq_len,
                                                    vocab)
    n = wl.total_params
    assert per_token == 6 * (n - vocab * h - (2 * layers + 1) * h) \
        + 12 * layers * h * seq_len
    assert 0.9 < per_token / (6 * n) < 1.3  # ~6N: no product for the embedding lookup
    step = sum(x.fwd_s + x.bwd_s for x in wl.layers)
    peak = hardware.device("H100").peak_tflops("bf16") * 1e12
    tokens = seq_len * micro_batch
    assert step == pytest.approx(tokens * per_token / (make_profiles.MFU * peak), rel=1e-4)
    assert (wl.batch_size, wl.seq_len) == (micro_batch, seq_len)
    for x in wl.layers:
        assert x.bwd_s == pytest.approx(2 * x.fwd_s, rel=1e-4)


def test_the_shipped_profiles_are_the_generators_defaults():
    for size in LLAMAS:
        shipped = load_workload(llama_name(size))
        assert shipped == Workload.from_dict(make_profiles.llama(size), source=shipped.name)
    assert load_workload("vit_l") == Workload.from_dict(make_profiles.vit_l(), source="vit_l")


def test_vit_l_has_197_tokens_and_its_flops_in_closed_form():
    h, ff, layers, _heads, patch, side = make_profiles.VIT_L
    batch = 64
    wl = load_workload("vit_l")
    seq = (side // patch) ** 2 + 1
    assert seq == 197 and wl.batch_size == batch
    fwd = (2 * batch * (seq - 1) * 3 * patch * patch * h
           + layers * (2 * batch * seq * (4 * h * h + 2 * h * ff) + 4 * batch * seq * seq * h)
           + 2 * batch * h * 1000)
    step = sum(x.fwd_s + x.bwd_s for x in wl.layers)
    peak = hardware.device("H100").peak_tflops("bf16") * 1e12
    assert step == pytest.approx(3 * fwd / (make_profiles.MFU * peak), rel=1e-4)


def test_a_sequence_profiles_compute_grows_linearly_with_the_batch():
    one = simulate("llama_1b", "mpi", workers=1, bandwidth_gbps=100, precision="bf16")
    four = simulate("llama_1b", "mpi", workers=1, bandwidth_gbps=100, precision="bf16",
                    batch_size=4)
    assert four.iteration_time_s == pytest.approx(4 * one.iteration_time_s, rel=1e-9)
    assert four.throughput == pytest.approx(one.throughput, rel=1e-9)


def test_a_llama_point_rescales_by_the_bf16_peaks_and_to_fp8_by_the_precision_rule():
    wl = load_workload("llama_7b")
    step = sum(x.fwd_s + x.bwd_s for x in wl.layers)
    h100, b200 = hardware.device("H100"), hardware.device("B200")
    a = wl.matmul_fraction
    want = a * 989.5 / 2250.0 + (1 - a) * h100.mem_gbps / b200.mem_gbps
    assert wl.compute_factor("B200", None, "bf16") == pytest.approx(want, rel=1e-12)
    fp8 = simulate("llama_7b", "mpi", workers=1, bandwidth_gbps=100, device="H100",
                   precision="fp8")
    assert fp8.iteration_time_s == pytest.approx(step * (a / 2 + (1 - a)), rel=1e-9)
    # the default fp32 point computes the bf16 profile in fp32
    fp32 = simulate("llama_7b", "mpi", workers=1, bandwidth_gbps=100)
    assert fp32.iteration_time_s == pytest.approx(step * (a * 989.5 / 67.0 + (1 - a) * 2),
                                                  rel=1e-9)


def test_a_llama_7b_step_on_128_hosts_of_8_h100_is_cheap_to_simulate():
    """291 tensors, 35 layers: a data-parallel step over 1,024 GPUs is a few hundred events
    (an FSDP strategy adds per-layer gathers, the same order of magnitude)."""
    r = simulate("llama_7b", "horovod", hosts=128, gpus_per_host=8, bandwidth_gbps=400,
                 intra_link="nvlink", transport="rdma", device="H100", precision="bf16",
                 iterations=2, warmup=1, trace=False)
    assert r.workers == 1024 and r.events < 5_000
    assert r.iteration_time_s > sum(x.fwd_s + x.bwd_s for x in load_workload("llama_7b").layers)
    fp32 = simulate("llama_7b", "horovod", hosts=128, gpus_per_host=8, bandwidth_gbps=400,
                    intra_link="nvlink", transport="rdma", device="H100", iterations=2,
                    warmup=1, trace=False)
    # bf16 gradients: half the bytes of fp32 ones (to the fusion buffers' padding)
    assert sum(r.bytes_sent.values()) == pytest.approx(sum(fp32.bytes_sent.values()) / 2,
                                                       rel=1e-3)


def test_cli_profile_writes_a_generated_llama_at_the_users_shape(tmp_path, capsys):
    out = tmp_path / "l.yaml"
    rc = cli_main(["profile", "llama_13b", "-B", "2", "--seq-len", "2048", "--on", "H200",
                   "-o", str(out)])
    assert rc == 0
    data = yaml.safe_load(out.read_text())
    assert (data["batch_size"], data["seq_len"], data["device"], data["precision"]) == \
        (2, 2048, "H200", "bf16")
    assert Workload.from_dict(data) == Workload.from_dict(
        make_profiles.llama("13b", seq_len=2048, micro_batch=2, device="H200"))
    assert "13,015,864,320 parameters" in capsys.readouterr().out
    r = simulate(str(out), "horovod", hosts=2, gpus_per_host=8, bandwidth_gbps=400,
                 device="H200", precision="bf16")
    assert r.throughput > 0


@pytest.mark.parametrize("argv,words", [
    (["llama_7b", "-B", "1", "--on", "V100"], "device 'V100' has no bf16"),
    (["llama_7b", "-B", "1", "--on", "A100", "--precision", "fp8"], "devices with it"),
    (["vit_l", "-B", "8", "--seq-len", "100"], "--seq-len"),
    (["torchvision:resnet50", "-B", "2", "--seq-len", "10"], "--seq-len is for a generated"),
])
def test_cli_profile_generated_bad_options(argv, words, tmp_path, capsys):
    rc = cli_main(["profile", *argv, "-o", str(tmp_path / "x.yaml")])
    assert rc != 0 and words in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_the_torch_modules_list_the_generated_profiles_tensors():
    torch = pytest.importorskip("torch")
    from ddpbench.profiling import llm

    for size in LLAMAS:
        with torch.device("meta"):
            model = llm.llama(size)
        assert [(n, p.numel()) for n, p in model.named_parameters()] == \
            [(t.name, t.numel) for t in load_workload(llm.llama_name(size)).tensors]
    torchvision = pytest.importorskip("torchvision")
    with torch.device("meta"):
        vit = torchvision.models.vit_l_16(weights=None)
    assert [(n, p.numel()) for n, p in vit.named_parameters()] == \
        [(t.name, t.numel) for t in load_workload("vit_l").tensors]


def test_a_small_llama_module_trains_and_profiles():
    torch = pytest.importorskip("torch")
    from ddpbench import profiling
    from ddpbench.profiling import llm

    torch.manual_seed(0)
    model = llm.llama_module((64, 128, 2, 4, 2), vocab=100)
    m = profiling.measure(model, "tiny_llama", batch_size=2, input_shape=(16,), warmup=1,
                          repeats=1)
    modules = dict(model.named_modules())
    data = profiling.to_profile(m, [profiling.matmul_like(modules.get(n, model))
                                    for n, _k, _i in m.layers])
    wl = Workload.from_dict(data)
    h, ff, layers, heads, kv = 64, 128, 2, 4, 2
    assert wl.total_params == make_profiles.llama_params(h, ff, layers, heads, kv, vocab=100)
    assert not m.no_grad  # every weight, GQA's shared k and v included, got a gradient
    with pytest.raises(ValueError, match="heads must divide"):
        llm.llama_module((64, 128, 2, 5, 1))


# NVIDIA NeMo Framework's performance summary (docs.nvidia.com/nemo-framework/user-guide/24.09
# and 24.12, performance/performance_summary.html: pre-training at FP8 on DGX-H100, micro
# batch 1, sequence length 4096): tokens/s per GPU and model TFLOP/s per GPU. The 7B row is
# pure data parallelism on one node (8 GPUs, TP 1, PP 1); 13B (16 GPUs, PP 4) and 70B
# (64 GPUs, TP 4, PP 4) carry pipeline bubbles and tensor-parallel traffic that a single
# device's compute model lacks.
NEMO_FP8_H100 = [("7b", 16934, 780), ("13b", 8715, 760), ("70b", 1728, 768)]


@pytest.mark.parametrize("size,tokens_s,tflops", NEMO_FP8_H100)
def test_llama_fp8_throughput_on_an_h100_matches_nemos_published(size, tokens_s, tflops):
    r = simulate(f"llama_{size}", "mpi", workers=1, bandwidth_gbps=100, device="H100",
                 precision="fp8")
    assert 4096 / r.iteration_time_s == pytest.approx(tokens_s, rel=0.25)
    # NeMo's model FLOPs per token (its TFLOP/s over its tokens/s) are the closed form's
    h, ff, layers, heads, kv_heads = LLAMAS[size]
    per_token = make_profiles.llama_flops_per_token(h, ff, layers, heads, kv_heads, 4096)
    assert per_token == pytest.approx(tflops * 1e12 / tokens_s, rel=0.03)


def test_a_bf16_profile_on_a_device_without_bf16_changes_precision_first():
    """A V100 has no bf16: llama_7b's times go to fp16 on the H100 first (the precision
    rule), then to the V100 by the peak rule at fp16."""
    wl = load_workload("llama_7b")
    h100 = hardware.device("H100")
    a = wl.matmul_fraction
    first = hardware.precision_factor(a, h100, "bf16", "fp16")
    assert first == pytest.approx(a * 1.0 + (1 - a) * 1.0)  # same peak, same bytes
    a16 = a * 989.5 / 989.5 / first
    want = first * (a16 * 989.5 / 125.0 + (1 - a16) * 3350.0 / 900.0)
    assert wl.compute_factor("V100", None, "fp16") == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="device 'V100' has no bf16"):
        wl.compute_factor("V100", None, "bf16")
    # fp32 on a V100: to fp32 on the H100, then the device rule at fp32
    assert wl.compute_factor("V100", None, "fp32") > wl.compute_factor("H100", None, "fp32")


@pytest.mark.parametrize("size", sorted(make_profiles.MPTS))
def test_mpt_parameters_and_a_step_in_closed_form(size):
    """MPT (llm-foundry's configs): tied embeddings, learned positions, no biases; 6.7B for
    MPT-7B as its model card states; the step is 6 x the products' parameters plus the
    attention per token, at the stated MFU."""
    d, layers, _ = make_profiles.MPTS[size]
    wl = load_workload(f"mpt_{size}")
    assert wl.total_params == make_profiles.mpt_params(d, layers)
    assert len(wl.tensors) == 6 * layers + 3  # no separate lm_head: it is wte
    if size == "7b":
        assert wl.total_params == pytest.approx(6.7e9, rel=0.01)
    s = make_profiles.MPT_SEQ_LEN
    flops = s * (6 * (layers * 12 * d * d + make_profiles.MPT_VOCAB * d) + 12 * layers * d * s)
    peak = hardware.device(make_profiles.LLM_DEVICE).peak_tflops(make_profiles.LLM_PRECISION)
    step = sum(x.fwd_s + x.bwd_s for x in wl.layers)
    assert step == pytest.approx(flops / (make_profiles.MFU * peak * 1e12), rel=1e-4)
    with pytest.raises(ValueError, match="max_seq_len"):
        make_profiles.mpt(size, seq_len=4096)
