"""Write a stand-in Llama-7B profile (32 decoder layers of 9 tensors, ~6.7e9 parameters)."""
import sys, yaml
d, ff, v, L = 4096, 11008, 32000, 32
layers = [{"name": "embed", "fwd_ms": 0.5, "bwd_ms": 1.0,
           "tensors": [{"name": "embed_tokens.weight", "numel": v * d}]}]
for i in range(L):
    p = f"layers.{i}."
    ts = [("self_attn.q_proj.weight", d * d), ("self_attn.k_proj.weight", d * d),
          ("self_attn.v_proj.weight", d * d), ("self_attn.o_proj.weight", d * d),
          ("mlp.gate_proj.weight", d * ff), ("mlp.up_proj.weight", d * ff),
          ("mlp.down_proj.weight", ff * d), ("input_layernorm.weight", d),
          ("post_attention_layernorm.weight", d)]
    layers.append({"name": f"layer{i}", "fwd_ms": 10.0, "bwd_ms": 20.0,
                   "tensors": [{"name": p + n, "numel": k} for n, k in ts]})
layers.append({"name": "norm", "fwd_ms": 0.1, "bwd_ms": 0.2,
               "tensors": [{"name": "norm.weight", "numel": d}]})
layers.append({"name": "lm_head", "fwd_ms": 2.0, "bwd_ms": 4.0,
               "tensors": [{"name": "lm_head.weight", "numel": v * d}]})
prof = {"name": "llama7b_standin", "batch_size": 4, "gpu": "stand-in (H100, bf16)",
        "device": "H100", "matmul_fraction": 0.9, "layers": layers}
yaml.safe_dump(prof, open(sys.argv[1], "w"), sort_keys=False)
print(sum(t["numel"] for l in layers for t in l["tensors"]))
