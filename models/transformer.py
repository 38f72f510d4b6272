"""The GPT model (`model.kind = 'gpt'`): decoder-only, pre-norm LayerNorm, GELU MLP, multi-head causal attention with
rotary or learned positions, tied embedding. Each parameter carries its logical axis names (models/interface.py)."""

import jax
import jax.numpy as jnp
from flax import linen as nn

from models import attention
from models.config import LAYER_NORM_EPSILON, ModelConfig
from models.sharding import constrain

named = nn.with_logical_partitioning
RESIDUAL = ("batch", "length", "embed")


def layer_norm(cfg: ModelConfig, name: str, axis: str = "embed") -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=LAYER_NORM_EPSILON, dtype=cfg.dtype, scale_init=named(nn.initializers.ones, (axis,)),
                      bias_init=named(nn.initializers.zeros, (axis,)), name=name)


class CausalSelfAttention(nn.Module):
  """Multi-head self-attention that only looks at earlier positions."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, decode: bool = False) -> jax.Array:
    cfg = self.cfg
    head_dim = cfg.d_model // cfg.num_heads
    dense = lambda name: nn.DenseGeneral(
        (cfg.num_heads, head_dim), use_bias=False, dtype=cfg.dtype, name=name,
        kernel_init=named(nn.initializers.lecun_normal(), ("embed", "heads", "head_dim")))
    heads = ("batch", "length", "heads", "head_dim")
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = (constrain(dense(n)(x_BxLxD), heads) for n in ("query", "key", "value"))
    if cfg.qk_norm:  # bounds the attention logits, so a large learning rate cannot saturate the softmax
      q_BxLxHxK = layer_norm(cfg, "query_norm", "head_dim")(q_BxLxHxK)
      k_BxLxHxK = layer_norm(cfg, "key_norm", "head_dim")(k_BxLxHxK)
    out_BxLxHxK = attention.positioned(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, rope=cfg.positions == "rotary",
                                       decode=decode, max_len=cfg.max_len, dtype=cfg.dtype)
    return nn.DenseGeneral(cfg.d_model, axis=(-2, -1), use_bias=False, dtype=cfg.dtype, name="out",
                           kernel_init=named(nn.initializers.lecun_normal(), ("heads", "head_dim", "embed")))(
                               out_BxLxHxK)


class Block(nn.Module):
  """Pre-norm residual block: attention then MLP."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, decode: bool = False) -> jax.Array:
    cfg = self.cfg
    x_BxLxD = x_BxLxD + CausalSelfAttention(cfg, name="attn")(layer_norm(cfg, "ln1")(x_BxLxD), decode)
    dense = lambda features, axes, name: nn.Dense(
        features, dtype=cfg.dtype, name=name, kernel_init=named(nn.initializers.lecun_normal(), axes),
        bias_init=named(nn.initializers.zeros, axes[1:]))
    h_BxLxF = dense(cfg.mlp_dim, ("embed", "mlp"), "mlp_in")(layer_norm(cfg, "ln2")(x_BxLxD))
    h_BxLxF = constrain(nn.gelu(h_BxLxF), ("batch", "length", "mlp"))
    return constrain(x_BxLxD + dense(cfg.d_model, ("mlp", "embed"), "mlp_out")(h_BxLxF), RESIDUAL)


class TransformerLM(nn.Module):
  """Maps token ids [B, L] to next-token logits [B, L, vocab]; `decode=True` reads and extends the KV cache."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxL: jax.Array, decode: bool = False) -> jax.Array:
    cfg = self.cfg
    # Unit-variance logits at init through the tied output projection (trains faster than 0.02 here).
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, name="embed",
                     embedding_init=named(nn.initializers.normal(cfg.d_model**-0.5), ("vocab", "embed")))
    x_BxLxD = embed(tokens_BxL).astype(cfg.dtype)
    if cfg.positions == "learned":
      pos_embed = self.param("pos_embed", named(nn.initializers.normal(0.02), ("length", "embed")),
                             (cfg.max_len, cfg.d_model))
      x_BxLxD = x_BxLxD + _positions(pos_embed, tokens_BxL.shape[1], self, decode)[None].astype(cfg.dtype)
    x_BxLxD = constrain(self.perturb("embedded", x_BxLxD), RESIDUAL)  # (perturb: a no-op unless input gradients)
    block = nn.remat(Block, static_argnums=(2,)) if cfg.remat else Block
    for i in range(cfg.num_layers):
      x_BxLxD = block(cfg, name=f"block_{i}")(x_BxLxD, decode)
    x_BxLxD = layer_norm(cfg, "ln_final")(x_BxLxD)
    return constrain(embed.attend(x_BxLxD.astype(jnp.float32)), ("batch", "length", "vocab"))  # tied, fp32 logits


def _positions(table_PxD: jax.Array, length: int, module: nn.Module, decode: bool) -> jax.Array:
  """The learned position rows of these tokens: the first `length`, or with decode the next `length` after those
  cached (a counter of its own in the cache)."""
  if not decode:
    return table_PxD[:length]
  index = module.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
  start = index.value
  index.value = start + length
  return jax.lax.dynamic_slice_in_dim(table_PxD, start, length)
