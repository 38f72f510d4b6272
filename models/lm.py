"""Loss, init and parameter shardings for the byte-level LM."""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from models.transformer import ModelConfig, TransformerLM

PyTree = Any


def _logits(params: PyTree, cfg: ModelConfig, inputs_BxL: jax.Array) -> jax.Array:
  return TransformerLM(cfg).apply({"params": params}, inputs_BxL)


def _cross_entropy(logits_BxLxV: jax.Array, targets_BxL: jax.Array) -> jax.Array:
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, axis=-1)
  nll_BxL = -jnp.take_along_axis(logp_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
  return nll_BxL.mean()


def loss_fn(params: PyTree, cfg: ModelConfig, batch_BxT: jax.Array) -> jax.Array:
  """Mean next-token cross-entropy (nats) of a [B, L+1] batch of windows: what evaluations report."""
  return _cross_entropy(_logits(params, cfg, batch_BxT[:, :-1]), batch_BxT[:, 1:])


def train_loss(params: PyTree, cfg: ModelConfig, batch_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(objective, cross-entropy) of a batch: the objective adds cfg.z_loss × mean (log Z)² over positions (Z the
  softmax normalizer), which keeps the logits from drifting; without z-loss it is the cross-entropy itself."""
  logits_BxLxV = _logits(params, cfg, batch_BxT[:, :-1])
  cross_entropy = _cross_entropy(logits_BxLxV, batch_BxT[:, 1:])
  if not cfg.z_loss:
    return cross_entropy, cross_entropy
  log_z_BxL = jax.nn.logsumexp(logits_BxLxV, axis=-1)
  return cross_entropy + cfg.z_loss * jnp.square(log_z_BxL).mean(), cross_entropy


def init_params(cfg: ModelConfig, rng: jax.Array) -> PyTree:
  """Initial parameters (call under jit with out_shardings to place them directly)."""
  dummy_1xL = jnp.zeros((1, cfg.max_len), jnp.int32)
  return TransformerLM(cfg).init(rng, dummy_1xL)["params"]


def abstract_params(cfg: ModelConfig) -> PyTree:
  """Shapes and dtypes of the parameters, without allocating them."""
  return jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))


def param_specs(abstract: PyTree, data_size: int, fsdp: bool) -> PyTree:
  """PartitionSpecs: replicated, or (fsdp) each tensor split along its largest axis divisible by `data`."""

  def spec(leaf: jax.ShapeDtypeStruct) -> P:
    if not fsdp or leaf.ndim == 0:
      return P()
    for axis in np.argsort(leaf.shape)[::-1]:
      if leaf.shape[axis] % data_size == 0:
        parts = [None] * leaf.ndim
        parts[axis] = "data"
        return P(*parts)
    return P()

  return jax.tree.map(spec, abstract)


def param_shardings(cfg: ModelConfig, mesh: Mesh, fsdp: bool = False) -> PyTree:
  """NamedShardings of the parameters on a one-axis ('data') mesh."""
  specs = param_specs(abstract_params(cfg), mesh.shape["data"], fsdp)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs)


def count_params(params: PyTree) -> int:
  """Total number of parameter scalars."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
