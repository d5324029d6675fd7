"""Write a stand-in Llama-7B profile: 32 decoder layers of 9 tensors, 6.74e9 parameters.

Usage: ``python tools/standin_llama7b.py OUT.yaml``. The tensor shapes are Llama-7B's
(hidden 4,096, MLP 11,008, vocabulary 32,000); the compute times (10 ms forward, 20 ms
backward a decoder layer) are made up, for speed checks of the simulator only, not a
measurement.
"""

from __future__ import annotations

import sys

import yaml

D, FF, VOCAB, LAYERS = 4096, 11008, 32000, 32


def profile() -> dict:
    """Return the profile as :mod:`ddpbench.simulator.workload` reads it."""
    layers = [{"name": "embed", "fwd_ms": 0.5, "bwd_ms": 1.0,
               "tensors": [{"name": "embed_tokens.weight", "numel": VOCAB * D}]}]
    for i in range(LAYERS):
        shapes = [("self_attn.q_proj.weight", D * D), ("self_attn.k_proj.weight", D * D),
                  ("self_attn.v_proj.weight", D * D), ("self_attn.o_proj.weight", D * D),
                  ("mlp.gate_proj.weight", D * FF), ("mlp.up_proj.weight", D * FF),
                  ("mlp.down_proj.weight", FF * D), ("input_layernorm.weight", D),
                  ("post_attention_layernorm.weight", D)]
        layers.append({"name": f"layer{i}", "fwd_ms": 10.0, "bwd_ms": 20.0,
                       "tensors": [{"name": f"layers.{i}.{n}", "numel": k} for n, k in shapes]})
    layers.append({"name": "norm", "fwd_ms": 0.1, "bwd_ms": 0.2,
                   "tensors": [{"name": "norm.weight", "numel": D}]})
    layers.append({"name": "lm_head", "fwd_ms": 2.0, "bwd_ms": 4.0,
                   "tensors": [{"name": "lm_head.weight", "numel": VOCAB * D}]})
    return {"name": "llama7b_standin", "batch_size": 4, "gpu": "stand-in (H100, made-up times)",
            "device": "H100", "matmul_fraction": 0.9, "layers": layers}


if __name__ == "__main__":
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        yaml.safe_dump(profile(), f, sort_keys=False)
