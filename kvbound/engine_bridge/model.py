"""A Llama-architecture decoder with seeded random weights (nothing is downloaded).

`forward(tokens, positions, context)` runs a batch against the paged KV cache described by a
`ForwardContext`; with `context=None` it is one plain causal forward pass over a single
sequence without any cache (the correctness tests' reference). The layer operations that
have fused kernels (add + RMSNorm, rotary, SiLU * up) come from the context's kernel
backend, so the Triton path launches one kernel for each; without a context, the PyTorch twins.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import PagedBatch, backend
from .config import ModelShape


@dataclass
class ForwardContext:
    """Where one batch's tokens go in the KV pools and what each attends to.

    Token rows are ordered decode-type requests first (one row each), then prefill-type
    requests (c rows each), so each attention kernel gets one contiguous slice of rows.
    """

    ops: ModuleType  # kernel backend: write_kv, decode_attention, prefill_attention
    slot_mapping: torch.Tensor  # [T] pool slot of every token of the batch
    num_decode: int
    decode: PagedBatch | None
    prefill: PagedBatch | None
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (K pool, V pool)


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[T, head_dim / 2]` (float32) of each token's rotary angles."""
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.float()[:, None] * inv_freq
    return angles.cos(), angles.sin()


class Attention(nn.Module):
    def __init__(self, shape: ModelShape, layer: int):
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.qkv_proj = nn.Linear(shape.hidden, (shape.heads + 2 * shape.kv_heads) * shape.head_dim, bias=False)
        self.o_proj = nn.Linear(shape.heads * shape.head_dim, shape.hidden, bias=False)

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], ops: ModuleType,
                out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v `[T, heads or kv_heads, head_dim]`, rotated: views of one projection (into `out`, `[T,
        (heads + 2 kv_heads) head_dim]`, when given)."""
        tokens = x.shape[0]
        qkv = self.qkv_proj(x) if out is None else torch.matmul(x, self.qkv_proj.weight.t(), out=out)
        q, k, v = qkv.view(tokens, self.heads + 2 * self.kv_heads, self.head_dim).split(
            [self.heads, self.kv_heads, self.kv_heads], dim=1)
        ops.rotary_(q, k, *rope)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext | None,
               out: torch.Tensor) -> torch.Tensor:
        """Attention of the batch's tokens into `out` (shaped like q): the paged kernels, or without a
        context one plain causal pass over a single sequence."""
        if ctx is None:  # one sequence, no cache
            return out.copy_(F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                            is_causal=True, enable_gqa=True).transpose(0, 1))
        k_cache, v_cache = ctx.kv_caches[self.layer]
        tokens = ctx.slot_mapping.shape[0]  # rows past it (a padded piecewise batch) are not attended
        ctx.ops.write_kv(k[:tokens], v[:tokens], k_cache, v_cache, ctx.slot_mapping)
        if ctx.decode is not None:
            ctx.ops.decode_attention(q[:ctx.num_decode], k_cache, v_cache, ctx.decode, out[:ctx.num_decode])
        if ctx.prefill is not None:
            ctx.ops.prefill_attention(q[ctx.num_decode:tokens], k_cache, v_cache, ctx.prefill, out[ctx.num_decode:tokens])
        return out


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up in one matrix."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.gate_up_proj = nn.Linear(shape.hidden, 2 * shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor, ops: ModuleType) -> torch.Tensor:
        return self.down_proj(ops.silu_mul(self.gate_up_proj(x)))


def into(dest: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`dest` holding `value`: a copy unless an in-place kernel already wrote it there (the Triton
    add + RMSNorm updates the residual in place; its PyTorch twin returns a new tensor)."""
    if value.data_ptr() != dest.data_ptr():
        dest.copy_(value)
    return dest


class DecoderLayer(nn.Module):
    """A pre-norm decoder layer in two halves around attention, so that the piecewise CUDA graphs
    (piecewise.py) replay the halves and run attention between them."""

    def __init__(self, shape: ModelShape, layer: int):
        super().__init__()
        self.input_norm = nn.RMSNorm(shape.hidden, eps=shape.norm_eps)
        self.attn = Attention(shape, layer)
        self.post_attention_norm = nn.RMSNorm(shape.hidden, eps=shape.norm_eps)
        self.mlp = MLP(shape)

    def before_attention(self, x: torch.Tensor, residual: torch.Tensor | None, rope, ops: ModuleType,
                         qkv_out: torch.Tensor | None = None):
        """(q, k, v, residual stream): `x` is the previous layer's MLP output (the embeddings at the
        first layer, `residual` None), added to the residual stream by the fused add + RMSNorm."""
        if residual is None:
            residual, h = x, ops.rms_norm(x, self.input_norm.weight, self.input_norm.eps)
        else:
            h, residual = ops.add_rms_norm(x, residual, self.input_norm.weight, self.input_norm.eps)
        return (*self.attn.project(h, rope, ops, qkv_out), residual)

    def after_attention(self, attn_out: torch.Tensor, residual: torch.Tensor,
                        ops: ModuleType) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it); their sum is the layer's output.
        The addition is left to the next layer's fused add + RMSNorm."""
        h = self.attn.o_proj(attn_out.reshape(attn_out.shape[0], -1))
        h, residual = ops.add_rms_norm(h, residual, self.post_attention_norm.weight, self.post_attention_norm.eps)
        return self.mlp(h, ops), residual

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope, ctx: ForwardContext | None,
                ops: ModuleType) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v, residual = self.before_attention(x, residual, rope, ops)
        return self.after_attention(self.attn.attend(q, k, v, ctx, torch.empty_like(q)), residual, ops)


class LlamaModel(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(DecoderLayer(shape, i) for i in range(shape.layers))
        self.norm = nn.RMSNorm(shape.hidden, eps=shape.norm_eps)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    @classmethod
    def random(cls, shape: ModelShape, device: torch.device, dtype: torch.dtype, seed: int = 0) -> "LlamaModel":
        """Seeded random weights (PyTorch's default initialisers), created directly on `device`."""
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            with torch.device(device):
                model = cls(shape)
        return model.to(dtype).eval().requires_grad_(False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        """Final hidden states [T, hidden] (before the last norm) of the tokens at `positions`."""
        ops = ctx.ops if ctx is not None else backend("torch")
        rope = rotary_tables(positions, self.shape.head_dim, self.shape.rope_theta)
        x, residual = self.embed(tokens), None
        for layer in self.layers:
            x, residual = layer(x, residual, rope, ctx, ops)
        return x + residual

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()
