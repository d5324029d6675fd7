"""Llama-style decoder-only transformers: their layer definitions and a PyTorch module of them.

:data:`LLAMAS` holds the shapes of the shipped ``llama_*`` workloads, which
``simulator/make_profiles.py`` turns into profiles (FLOPs at a device's peak) and which
:func:`llama` builds as a ``torch.nn.Module`` for ``ddpbench profile`` to measure, e.g.::

    ddpbench profile ddpbench.profiling.llm:llama_7b --input-shape 4096 --batch-size 1 \\
        --device cuda -o llama_7b_measured.yaml --compare llama_7b

The module is Llama's architecture as Touvron et al. (2023) describe it (pre-normalisation
with RMSNorm, SwiGLU MLP, rotary position embeddings, grouped-query attention for 70B), with
Hugging Face ``LlamaForCausalLM``'s parameter names and creation order, so its tensor list is
the generated profile's. Its input is what the profiler feeds every model, a float tensor of
shape ``(batch, seq_len)``, which it maps to token ids in ``[0, vocab)``; its output is the
logits, whose mean the profiler differentiates (the loss's own cost is not the
cross-entropy's). ViT-L/16 needs no module here: ``torchvision:vit_l_16`` is it.
"""

from __future__ import annotations

from typing import Any

from ddpbench.profiling.model import import_torch

__all__ = ["LLAMAS", "LLAMA_VOCAB", "LLAMA_VOCABS", "LlamaShape", "llama", "llama3_70b",
           "llama3_8b", "llama_13b", "llama_1b", "llama_70b", "llama_7b", "llama_module",
           "llama_name", "llama_size", "llama_vocab"]

LlamaShape = tuple[int, int, int, int, int]
"""(hidden, intermediate, layers, attention heads, key-value heads)."""

LLAMAS: dict[str, LlamaShape] = {
    "1b": (2048, 5632, 22, 32, 4),
    "7b": (4096, 11008, 32, 32, 32),
    "13b": (5120, 13824, 40, 40, 40),
    "70b": (8192, 28672, 80, 64, 8),
    "3_8b": (4096, 14336, 32, 32, 8),
    "3_70b": (8192, 28672, 80, 64, 8),
}
"""Llama 2 (Touvron et al. 2023, Table 1 and section 2.2: 7B, 13B and 70B, grouped-query
attention with 8 key-value heads for 70B) as its Hugging Face configs state them
(meta-llama/Llama-2-{7b,13b,70b}-hf config.json: hidden_size, intermediate_size,
num_hidden_layers, num_attention_heads, num_key_value_heads); ``1b`` is TinyLlama-1.1B (Zhang
et al. 2024, Table 1; TinyLlama/TinyLlama-1.1B config.json), Llama 2's architecture and
tokenizer at 22 layers with 4 key-value heads. ``3_8b`` and ``3_70b`` are Llama 3 (Llama
Team, "The Llama 3 Herd of Models", 2024, Table 3; meta-llama/Meta-Llama-3-8B and -70B
config.json): grouped-query attention with 8 key-value heads at both sizes, Llama 3.1's
shapes too."""

LLAMA_VOCAB = 32_000
"""Llama 2's and TinyLlama's vocabulary (config.json ``vocab_size``); lm_head is untied."""

LLAMA_VOCABS: dict[str, int] = {"3_8b": 128_256, "3_70b": 128_256}
"""Vocabularies other than :data:`LLAMA_VOCAB`: Llama 3's tokenizer (config.json
``vocab_size`` 128256; lm_head untied)."""


def llama_vocab(size: str) -> int:
    """Return the vocabulary of Llama size ``size`` (a key of :data:`LLAMAS`)."""
    return LLAMA_VOCABS.get(size, LLAMA_VOCAB)


def llama_name(size: str) -> str:
    """Return the workload name of Llama size ``size``: ``llama_7b``, ``llama3_8b``."""
    return f"llama3_{size[2:]}" if size.startswith("3_") else f"llama_{size}"


def llama_size(name: str) -> str:
    """Return the :data:`LLAMAS` key of workload ``name`` (the inverse of :func:`llama_name`)."""
    return f"3_{name[7:]}" if name.startswith("llama3_") else name.removeprefix("llama_")


def llama(size: str, vocab: int | None = None) -> Any:
    """Return a Llama-style ``torch.nn.Module`` of ``size`` (a key of :data:`LLAMAS`),
    initialised at random.

    Raises:
        ValueError: an unknown size, or torch missing.
    """
    if size not in LLAMAS:
        raise ValueError(f"unknown Llama size {size!r}; known: {sorted(LLAMAS)}")
    return llama_module(LLAMAS[size], llama_vocab(size) if vocab is None else vocab)


def llama_module(shape: LlamaShape, vocab: int = LLAMA_VOCAB) -> Any:  # noqa: C901
    """Return a Llama-style ``torch.nn.Module`` of ``shape`` (any, e.g. a small one to test).

    Raises:
        ValueError: heads that do not divide the hidden size or kv heads that do not divide
            the heads, or torch missing.
    """
    hidden, inter, nlayers, heads, kv_heads = shape
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"Llama shape {shape}: heads must divide hidden and kv heads the heads")
    torch = import_torch()
    nn, f = torch.nn, torch.nn.functional
    head_dim = hidden // heads

    class Attention(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            kv = kv_heads * head_dim
            self.q_proj = nn.Linear(hidden, hidden, bias=False)
            self.k_proj = nn.Linear(hidden, kv, bias=False)
            self.v_proj = nn.Linear(hidden, kv, bias=False)
            self.o_proj = nn.Linear(hidden, hidden, bias=False)

        def forward(self, x: Any, rope: tuple[Any, Any]) -> Any:
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, heads, head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, s, kv_heads, head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, s, kv_heads, head_dim).transpose(1, 2)
            q, k = _rotate(q, *rope), _rotate(k, *rope)
            if kv_heads != heads:  # grouped-query attention: each kv head serves a group
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
            out = f.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(out.transpose(1, 2).reshape(b, s, hidden))

    class Mlp(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj = nn.Linear(hidden, inter, bias=False)
            self.up_proj = nn.Linear(hidden, inter, bias=False)
            self.down_proj = nn.Linear(inter, hidden, bias=False)

        def forward(self, x: Any) -> Any:
            return self.down_proj(f.silu(self.gate_proj(x)) * self.up_proj(x))

    class DecoderLayer(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.self_attn = Attention()
            self.mlp = Mlp()
            self.input_layernorm = nn.RMSNorm(hidden, eps=1e-5)
            self.post_attention_layernorm = nn.RMSNorm(hidden, eps=1e-5)

        def forward(self, x: Any, rope: tuple[Any, Any]) -> Any:
            x = x + self.self_attn(self.input_layernorm(x), rope)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Decoder(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, hidden)
            self.layers = nn.ModuleList(DecoderLayer() for _ in range(nlayers))
            self.norm = nn.RMSNorm(hidden, eps=1e-5)

    class CausalLM(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = Decoder()
            self.lm_head = nn.Linear(hidden, vocab, bias=False)

        def forward(self, x: Any) -> Any:
            ids = (x.detach().abs() * 1e4).long() % vocab
            h = self.model.embed_tokens(ids)
            rope = _rope(torch, ids.shape[1], head_dim, h.device, h.dtype)
            for layer in self.model.layers:
                h = layer(h, rope)
            return self.lm_head(self.model.norm(h))

    return CausalLM()


def _rope(torch: Any, seq: int, dim: int, device: Any, dtype: Any) -> tuple[Any, Any]:
    """Return the rotary embedding's cosines and sines, base 10000 (RoFormer, Su et al.)."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(x: Any, cos: Any, sin: Any) -> Any:
    """Rotate the halves of ``x``'s last dimension by the position's angles."""
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def llama_1b() -> Any:
    """Return the ``llama_1b`` module (TinyLlama-1.1B's shapes)."""
    return llama("1b")


def llama_7b() -> Any:
    """Return the ``llama_7b`` module (Llama 2 7B's shapes)."""
    return llama("7b")


def llama_13b() -> Any:
    """Return the ``llama_13b`` module (Llama 2 13B's shapes)."""
    return llama("13b")


def llama_70b() -> Any:
    """Return the ``llama_70b`` module (Llama 2 70B's shapes)."""
    return llama("70b")


def llama3_8b() -> Any:
    """Return the ``llama3_8b`` module (Llama 3 8B's shapes and vocabulary)."""
    return llama("3_8b")


def llama3_70b() -> Any:
    """Return the ``llama3_70b`` module (Llama 3 70B's shapes and vocabulary)."""
    return llama("3_70b")
