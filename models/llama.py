"""The Llama-family model (`model.kind = 'llama'`): pre-norm RMSNorm, SwiGLU MLP, grouped-query attention with
rotary positions, tied or untied embeddings, optional QK-norm (RMSNorm per head) and z-loss (models/lm.py).

Its parameters map one to one onto transformers' LlamaForCausalLM (runtime/trained/export.py), whose conventions it
follows: RoPE on the two halves of each head (base 10,000), RMSNorm's epsilon 1e-6 in fp32, key/value head g
shared by query heads g·H/G … (g+1)·H/G − 1, no biases.
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from models import attention
from models.config import RMS_EPSILON, ModelConfig
from models.sharding import constrain

named = nn.with_logical_partitioning
RESIDUAL = ("batch", "length", "embed")


def rms_norm(cfg: ModelConfig, name: str, axis: str = "embed") -> nn.RMSNorm:
  return nn.RMSNorm(epsilon=RMS_EPSILON, dtype=cfg.dtype, scale_init=named(nn.initializers.ones, (axis,)), name=name)


def _dense(features, axes: tuple[str, ...], cfg: ModelConfig, name: str, axis=-1) -> nn.DenseGeneral:
  return nn.DenseGeneral(features, axis=axis, use_bias=False, dtype=cfg.dtype, name=name,
                         kernel_init=named(nn.initializers.lecun_normal(), axes))


class Attention(nn.Module):
  """Grouped-query causal self-attention: num_heads query heads share num_kv_heads key/value heads."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, decode: bool = False) -> jax.Array:
    cfg = self.cfg
    head_dim, groups = cfg.d_model // cfg.num_heads, cfg.kv_heads()
    heads, kv_heads = ("batch", "length", "heads", "head_dim"), ("batch", "length", "kv_heads", "head_dim")
    q_BxLxHxK = constrain(_dense((cfg.num_heads, head_dim), ("embed", *heads[2:]), cfg, "query")(x_BxLxD), heads)
    k_BxLxGxK = constrain(_dense((groups, head_dim), ("embed", *kv_heads[2:]), cfg, "key")(x_BxLxD), kv_heads)
    v_BxLxGxK = constrain(_dense((groups, head_dim), ("embed", *kv_heads[2:]), cfg, "value")(x_BxLxD), kv_heads)
    if cfg.qk_norm:
      q_BxLxHxK = rms_norm(cfg, "query_norm", "head_dim")(q_BxLxHxK)
      k_BxLxGxK = rms_norm(cfg, "key_norm", "head_dim")(k_BxLxGxK)
    out_BxLxHxK = attention.positioned(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, rope=True, decode=decode,
                                       max_len=cfg.max_len, dtype=cfg.dtype)
    return _dense(cfg.d_model, ("heads", "head_dim", "embed"), cfg, "out", axis=(-2, -1))(out_BxLxHxK)


class Block(nn.Module):
  """x + attention(norm x), then + down(silu(gate(norm x)) · up(norm x))."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, decode: bool = False) -> jax.Array:
    cfg = self.cfg
    x_BxLxD = x_BxLxD + Attention(cfg, name="attn")(rms_norm(cfg, "attn_norm")(x_BxLxD), decode)
    h_BxLxD = rms_norm(cfg, "mlp_norm")(x_BxLxD)
    gate_BxLxF = _dense(cfg.mlp_dim, ("embed", "mlp"), cfg, "gate")(h_BxLxD)
    up_BxLxF = _dense(cfg.mlp_dim, ("embed", "mlp"), cfg, "up")(h_BxLxD)
    hidden_BxLxF = constrain(nn.silu(gate_BxLxF) * up_BxLxF, ("batch", "length", "mlp"))
    return constrain(x_BxLxD + _dense(cfg.d_model, ("mlp", "embed"), cfg, "down")(hidden_BxLxF), RESIDUAL)


class LlamaLM(nn.Module):
  """Maps token ids [B, L] to next-token logits [B, L, vocab] (fp32); `decode=True` reads and extends the cache."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxL: jax.Array, decode: bool = False) -> jax.Array:
    cfg = self.cfg
    scale = cfg.d_model**-0.5 if cfg.tied_embeddings else 1.0  # tied: unit-variance logits at init
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, name="embed",
                     embedding_init=named(nn.initializers.normal(scale), ("vocab", "embed")))
    x_BxLxD = constrain(self.perturb("embedded", embed(tokens_BxL).astype(cfg.dtype)), RESIDUAL)
    block = nn.remat(Block, static_argnums=(2,)) if cfg.remat else Block
    for i in range(cfg.num_layers):
      x_BxLxD = block(cfg, name=f"block_{i}")(x_BxLxD, decode)
    x_BxLxD = rms_norm(cfg, "final_norm")(x_BxLxD).astype(jnp.float32)
    if cfg.tied_embeddings:
      return constrain(embed.attend(x_BxLxD), ("batch", "length", "vocab"))
    return constrain(nn.Dense(cfg.vocab_size, use_bias=False, name="lm_head",
                              kernel_init=named(nn.initializers.lecun_normal(), ("embed", "vocab")))(x_BxLxD),
                     ("batch", "length", "vocab"))
