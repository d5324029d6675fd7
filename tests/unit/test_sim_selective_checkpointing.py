"""Selective activation checkpointing in the simulator: torchtitan's ``"layer:N"`` and
``"op"`` policies (torchtitan/distributed/activation_checkpoint.py), checked in closed form
against the profiles' own forward times (ddpbench.simulator.workload.Workload.recomputed)."""

from __future__ import annotations

import textwrap

import pytest

from ddpbench import contract
from ddpbench.experiments import schema
from ddpbench.experiments.validation.data import Setting
from ddpbench.simulator import simulate
from ddpbench.simulator.workload import load_workload

BLOCKS = ("llama_1b", "mpt_7b", "gpt2_xl", "bert_base", "vit_l")
FLAT = ("resnet50", "vgg16", "seq2seq_lstm")


def _extra(wl, other):
    """Per layer: the backward time ``other`` adds over ``wl``."""
    return [b.bwd_s - a.bwd_s for a, b in zip(wl.layers, other.layers)]


def _plus(wl, extra):
    """Per layer: ``wl``'s backward time plus ``extra``'s, as ``recomputed`` adds them."""
    return [x.bwd_s + e if e else x.bwd_s for x, e in zip(wl.layers, extra)]


def _bwd(wl):
    return [x.bwd_s for x in wl.layers]


@pytest.mark.parametrize("name", FLAT)
def test_layer_1_equals_full_on_a_profile_without_blocks(name):
    wl = load_workload(name)
    assert wl.recomputed("layer:1") == wl.recomputed(True)


@pytest.mark.parametrize("name", BLOCKS)
def test_layer_1_recomputes_every_block_and_nothing_outside(name):
    # torchtitan wraps only the transformer blocks: embedding, norm and head are not
    # recomputed, so layer:1 is full checkpointing less those layers' forwards
    wl = load_workload(name)
    blocks = wl.blocks()
    assert None in blocks
    want = [x.fwd_s if b is not None else 0.0 for x, b in zip(wl.layers, blocks)]
    assert _bwd(wl.recomputed("layer:1")) == _plus(wl, want)
    assert sum(_extra(wl, wl.recomputed(True))) - sum(want) == pytest.approx(
        sum(x.fwd_s for x, b in zip(wl.layers, blocks) if b is None))


def test_llama_blocks_are_the_model_layers_children():
    wl = load_workload("llama_1b")
    named = {x.name: b for x, b in zip(wl.layers, wl.blocks())}
    assert named["model.embed_tokens"] is None and named["lm_head"] is None
    assert named["model.norm"] is None
    assert [named[f"model.layers.{k}"] for k in range(22)] == list(range(22))


def test_sub_block_layers_belong_to_their_block():
    wl = load_workload("gpt2_xl")
    named = {x.name: b for x, b in zip(wl.layers, wl.blocks())}
    assert named["transformer.h.0.ln_1"] == named["transformer.h.0.attn.c_attn"] == 0
    assert named["transformer.h.47.ln_1"] == 47
    assert named["transformer.wte"] is None


@pytest.mark.parametrize("name", (*BLOCKS, *FLAT))
@pytest.mark.parametrize("n", [2, 3, 5])
def test_layer_n_adds_the_forwards_of_every_nth_block(name, n):
    # _apply_layer_sac: the counter is raised before the test, so blocks counted 1, 2, ...
    # are wrapped when count % n == 0: 0-based blocks n-1, 2n-1, ...
    wl = load_workload(name)
    picked = {b for b in wl.blocks() if b is not None and (b + 1) % n == 0}
    want = [x.fwd_s if b in picked else 0.0 for x, b in zip(wl.layers, wl.blocks())]
    out = wl.recomputed(f"layer:{n}")
    assert _bwd(out) == _plus(wl, want)
    assert [x.fwd_s for x in out.layers] == [x.fwd_s for x in wl.layers]


def test_layer_2_on_llama_recomputes_the_odd_blocks_exactly():
    wl = load_workload("llama_1b")
    out = wl.recomputed("layer:2")
    by_name = {x.name: x for x in wl.layers}
    for x in out.layers:
        k = int(x.name.rsplit(".", 1)[1]) if x.name.startswith("model.layers.") else None
        extra = by_name[x.name].fwd_s if k is not None and k % 2 == 1 else 0.0
        assert x.bwd_s == by_name[x.name].bwd_s + extra


def test_op_recomputes_the_non_matmul_share_and_every_second_linear_of_a_llama_block():
    # Llama 3 8B block: q, k, v, o, gate, up, down in forward order; the 2nd, 4th and 6th
    # (k, o, up) are recomputed, by weight size, with every operator outside the save list
    wl = load_workload("llama3_8b")
    m = wl.matmul_fraction
    h, kv, ff = 4096, 1024, 14336
    r = (h * kv + h * h + h * ff) / (2 * h * h + 2 * h * kv + 3 * h * ff)
    want = [x.fwd_s * ((1 - m) + m * r) if x.name.startswith("model.layers.") else 0.0
            for x in wl.layers]
    assert _bwd(wl.recomputed("op")) == pytest.approx(_plus(wl, want), rel=1e-12)


@pytest.mark.parametrize("name", FLAT)
def test_op_on_a_profile_without_blocks_recomputes_the_non_matmul_share(name):
    # each layer is a block of its own, so its one linear is the first: none recomputed
    wl = load_workload(name)
    m = wl.matmul_fraction
    want = [x.fwd_s * (1 - m) for x in wl.layers]
    assert _bwd(wl.recomputed("op")) == pytest.approx(_plus(wl, want), rel=1e-12)


def test_op_needs_a_matmul_fraction():
    wl = load_workload("resnet50").model_copy(update={"matmul_fraction": None})
    with pytest.raises(ValueError, match="matmul_fraction"):
        wl.recomputed("op")


def test_false_is_the_profile_itself():
    wl = load_workload("llama_1b")
    assert wl.recomputed(False) is wl


@pytest.mark.parametrize("value", ["op", "layer:1", "layer:2", "layer:12", True, False])
def test_schedule_round_trips_every_form(value):
    s = contract.Schedule.from_point({"activation_checkpointing": value})
    assert s.activation_checkpointing == value
    assert type(s.activation_checkpointing) is type(value)
    assert contract.Schedule.model_validate(s.model_dump()) == s
    assert contract.check_axis("activation_checkpointing", value) == value


def test_the_default_serialises_as_before():
    assert contract.Schedule().model_dump()["activation_checkpointing"] is False
    assert contract.NEUTRAL_AT_DEFAULT["activation_checkpointing"] is False


@pytest.mark.parametrize("value", ["layer:0", "layer:x", "layer:", "layer:-1", "layer:1.5",
                                   "ops", "full", "true", 2, 1, 0, 1.0, None])
def test_a_bad_value_names_the_field_and_the_forms(value):
    with pytest.raises(ValueError, match=r"activation_checkpointing must be false, true .*"
                                         r"'op'.*'layer:N'") as info:
        contract.Schedule.from_point({"activation_checkpointing": value})
    assert repr(value) in str(info.value)
    with pytest.raises(ValueError, match="activation_checkpointing must be false, true"):
        contract.check_axis("activation_checkpointing", value)
    with pytest.raises(ValueError, match="'layer:N'"):
        load_workload("resnet50").recomputed(value)


def test_an_experiment_axis_takes_the_strings_and_refuses_the_rest():
    text = """\
    name: x
    workloads: [llama_1b]
    backends: [horovod]
    workers: [2]
    bandwidth_gbps: [10]
    activation_checkpointing: [false, true, op, "layer:2"]
    """
    exp = schema.parse_experiment(textwrap.dedent(text), "exp.yaml")
    assert exp.spec.activation_checkpointing == (False, True, "op", "layer:2")
    with pytest.raises(schema.ExperimentError, match="activation_checkpointing"):
        schema.parse_experiment(textwrap.dedent(text).replace('"layer:2"', '"layer:0"'),
                                "exp.yaml")


def test_a_validation_setting_takes_the_strings():
    assert Setting(workload="llama_1b", activation_checkpointing="layer:2"
                   ).activation_checkpointing == "layer:2"
    with pytest.raises(ValueError, match="activation_checkpointing"):
        Setting(workload="llama_1b", activation_checkpointing="ops")


KW = dict(workers=2, bandwidth_gbps=10_000, iterations=3, warmup=1)  # compute-bound


def test_the_simulator_runs_the_recomputed_profile():
    full = simulate("resnet50", "horovod", activation_checkpointing=True, **KW)
    layer1 = simulate("resnet50", "horovod", activation_checkpointing="layer:1", **KW)
    assert layer1.iteration_time_s == full.iteration_time_s
    none = simulate("llama_1b", "horovod", **KW)
    half = simulate("llama_1b", "horovod", activation_checkpointing="layer:2", **KW)
    op = simulate("llama_1b", "horovod", activation_checkpointing="op", **KW)
    every = simulate("llama_1b", "horovod", activation_checkpointing="layer:1", **KW)
    assert none.iteration_time_s < half.iteration_time_s < every.iteration_time_s
    assert none.iteration_time_s < op.iteration_time_s < every.iteration_time_s
    full = simulate("llama_1b", "horovod", activation_checkpointing=True, **KW)
    assert every.iteration_time_s < full.iteration_time_s  # embedding and head not recomputed


@pytest.mark.parametrize("value", ["op", "layer:2"])
def test_a_real_point_refuses_selective_checkpointing(value):
    from ddpbench.experiments.throughput.points import run_point

    with pytest.raises(ValueError, match="activation_checkpointing is simulated only"):
        run_point({"mode": "real", "backend": "mpi", "workload": "bert_large", "workers": 2,
                   "bandwidth_gbps": 10.0, "latency_us": 5.0,
                   "activation_checkpointing": value})
