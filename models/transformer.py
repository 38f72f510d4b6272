"""Decoder-only Transformer LM (pre-norm, causal attention, rotary or learned positions)."""

import jax
import jax.numpy as jnp
from flax import linen as nn

from models.config import ModelConfig


def _rotary(x_BxLxHxK: jax.Array) -> jax.Array:
  """Rotates channel pairs by position-dependent angles (RoPE)."""
  _, length, _, head_dim = x_BxLxHxK.shape
  half = head_dim // 2
  freqs_F = 1.0 / (10_000 ** (jnp.arange(half, dtype=jnp.float32) / half))
  angles_LxF = jnp.arange(length, dtype=jnp.float32)[:, None] * freqs_F[None, :]
  sin, cos = jnp.sin(angles_LxF)[None, :, None, :], jnp.cos(angles_LxF)[None, :, None, :]
  x1, x2 = x_BxLxHxK[..., :half], x_BxLxHxK[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxLxHxK.dtype)


class CausalSelfAttention(nn.Module):
  """Multi-head self-attention that only looks at earlier positions."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    cfg = self.cfg
    head_dim = cfg.d_model // cfg.num_heads
    dense = lambda name: nn.DenseGeneral(
        (cfg.num_heads, head_dim), use_bias=False, dtype=cfg.dtype, name=name)
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = dense("query")(x_BxLxD), dense("key")(x_BxLxD), dense("value")(x_BxLxD)
    if cfg.qk_norm:  # bounds the attention logits, so a large learning rate cannot saturate the softmax
      q_BxLxHxK = nn.LayerNorm(dtype=cfg.dtype, name="query_norm")(q_BxLxHxK)
      k_BxLxHxK = nn.LayerNorm(dtype=cfg.dtype, name="key_norm")(k_BxLxHxK)
    if cfg.positions == "rotary":
      q_BxLxHxK, k_BxLxHxK = _rotary(q_BxLxHxK), _rotary(k_BxLxHxK)
    length = x_BxLxD.shape[1]
    mask_1x1xLxL = jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]
    logits_BxHxLxL = jnp.einsum("bqhk,bthk->bhqt", q_BxLxHxK, k_BxLxHxK) / jnp.sqrt(head_dim).astype(cfg.dtype)
    logits_BxHxLxL = jnp.where(mask_1x1xLxL, logits_BxHxLxL, jnp.finfo(logits_BxHxLxL.dtype).min)
    probs_BxHxLxL = jax.nn.softmax(logits_BxHxLxL.astype(jnp.float32), axis=-1).astype(cfg.dtype)
    out_BxLxHxK = jnp.einsum("bhqt,bthk->bqhk", probs_BxHxLxL, v_BxLxHxK)
    return nn.DenseGeneral(cfg.d_model, axis=(-2, -1), use_bias=False, dtype=cfg.dtype, name="out")(out_BxLxHxK)


class Block(nn.Module):
  """Pre-norm residual block: attention then MLP."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    cfg = self.cfg
    x_BxLxD = x_BxLxD + CausalSelfAttention(cfg, name="attn")(nn.LayerNorm(dtype=cfg.dtype, name="ln1")(x_BxLxD))
    h_BxLxF = nn.Dense(cfg.mlp_dim, dtype=cfg.dtype, name="mlp_in")(nn.LayerNorm(dtype=cfg.dtype, name="ln2")(x_BxLxD))
    return x_BxLxD + nn.Dense(cfg.d_model, dtype=cfg.dtype, name="mlp_out")(nn.gelu(h_BxLxF))


class TransformerLM(nn.Module):
  """Maps token ids [B, L] to next-token logits [B, L, vocab]."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxL: jax.Array) -> jax.Array:
    cfg = self.cfg
    # Unit-variance logits at init through the tied output projection (trains faster than 0.02 here).
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(cfg.d_model**-0.5),
                     name="embed")
    x_BxLxD = embed(tokens_BxL).astype(cfg.dtype)
    if cfg.positions == "learned":
      pos_embed = self.param("pos_embed", nn.initializers.normal(0.02), (cfg.max_len, cfg.d_model))
      x_BxLxD = x_BxLxD + pos_embed[None, : tokens_BxL.shape[1]].astype(cfg.dtype)
    x_BxLxD = self.perturb("embedded", x_BxLxD)  # a zero no-op unless gradients w.r.t. inputs are asked for
    block = nn.remat(Block) if cfg.remat else Block
    for i in range(cfg.num_layers):
      x_BxLxD = block(cfg, name=f"block_{i}")(x_BxLxD)
    x_BxLxD = nn.LayerNorm(dtype=cfg.dtype, name="ln_final")(x_BxLxD)
    return embed.attend(x_BxLxD.astype(jnp.float32))  # tied output projection, fp32 logits
