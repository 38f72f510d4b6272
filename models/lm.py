"""Loss, init, parameter placement and cached decoding of any model (models/interface.py), by `cfg.kind`."""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from models import interface
from models.config import ModelConfig
from models.sharding import TENSOR_RULES

PyTree = Any


def logits(params: PyTree, cfg: ModelConfig, inputs_BxL: jax.Array) -> jax.Array:
  return interface.spec_of(cfg.kind).module(cfg).apply({"params": params}, inputs_BxL)


def _cross_entropy(logits_BxLxV: jax.Array, targets_BxL: jax.Array) -> jax.Array:
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, axis=-1)
  nll_BxL = -jnp.take_along_axis(logp_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
  return nll_BxL.mean()


def loss_fn(params: PyTree, cfg: ModelConfig, batch_BxT: jax.Array) -> jax.Array:
  """Mean next-token cross-entropy (nats) of a [B, L+1] batch of windows: what evaluations report."""
  return _cross_entropy(logits(params, cfg, batch_BxT[:, :-1]), batch_BxT[:, 1:])


def train_loss(params: PyTree, cfg: ModelConfig, batch_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(objective, cross-entropy) of a batch. The objective is the model's own (its spec's), or the cross-entropy
  plus cfg.z_loss × mean (log Z)² over positions (Z the softmax normalizer), which keeps the logits from drifting."""
  logits_BxLxV = logits(params, cfg, batch_BxT[:, :-1])
  cross_entropy = _cross_entropy(logits_BxLxV, batch_BxT[:, 1:])
  objective = interface.spec_of(cfg.kind).objective
  if objective is not None:
    return objective(logits_BxLxV, batch_BxT[:, 1:], cfg), cross_entropy
  if not cfg.z_loss:
    return cross_entropy, cross_entropy
  log_z_BxL = jax.nn.logsumexp(logits_BxLxV, axis=-1)
  return cross_entropy + cfg.z_loss * jnp.square(log_z_BxL).mean(), cross_entropy


def init_params(cfg: ModelConfig, rng: jax.Array) -> PyTree:
  """Initial parameters (call under jit with out_shardings to place them directly)."""
  return nn.meta.unbox(interface.boxed_init(cfg, rng))


def abstract_params(cfg: ModelConfig) -> PyTree:
  """Shapes and dtypes of the parameters, without allocating them."""
  return jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))


def param_specs(cfg: ModelConfig, mesh_shape: dict[str, int], fsdp: bool) -> PyTree:
  """PartitionSpecs on a mesh with a 'data' axis (and optionally 'tensor'; a 'slice' axis replicates): with a
  'tensor' axis wider than 1, each parameter's first logical axis of TENSOR_RULES that it divides is split across
  it; with fsdp, the largest remaining axis that 'data' divides is split across 'data'; the rest is replicated."""
  data, tensor = mesh_shape["data"], mesh_shape.get("tensor", 1)
  rules = dict(TENSOR_RULES)

  def spec(leaf: jax.ShapeDtypeStruct, names: P) -> P:
    parts = [None] * leaf.ndim
    if tensor > 1:
      for axis, name in enumerate(tuple(names) + (None,) * (leaf.ndim - len(names))):
        if rules.get(name) == "tensor" and leaf.shape[axis] % tensor == 0:
          parts[axis] = "tensor"
          break
    if fsdp:
      for axis in np.argsort(leaf.shape)[::-1]:
        if parts[axis] is None and leaf.shape[axis] % data == 0:
          parts[axis] = "data"
          break
    return P(*parts) if any(parts) else P()

  return jax.tree.map(spec, abstract_params(cfg), logical_axes(cfg))


def logical_axes(cfg: ModelConfig) -> PyTree:
  """Each parameter's logical axis names (a PartitionSpec of names), in the parameters' tree."""
  return jax.tree.map(lambda _, names: names, abstract_params(cfg), interface.logical_axes(cfg),
                      is_leaf=lambda x: isinstance(x, P))


def param_shardings(cfg: ModelConfig, mesh: Mesh, fsdp: bool = False) -> PyTree:
  """NamedShardings of the parameters on a learner's or DP's mesh (see param_specs)."""
  specs = param_specs(cfg, dict(mesh.shape), fsdp)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def count_params(params: PyTree) -> int:
  """Total number of parameter scalars."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def decodes(cfg: ModelConfig) -> bool:
  """Whether the model samples with a KV cache (see models/attention.py)."""
  return interface.spec_of(cfg.kind).decodes


def empty_cache(cfg: ModelConfig, batch: int) -> PyTree:
  """A KV cache for `batch` sequences of up to cfg.max_len tokens, at position 0."""
  module = interface.spec_of(cfg.kind).module(cfg)
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros((batch, 1), jnp.int32), decode=True))
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])


def decode(params: PyTree, cfg: ModelConfig, cache: PyTree, tokens_BxL: jax.Array) -> tuple[jax.Array, PyTree]:
  """(logits [B, L, V], the cache extended by these tokens at the positions after those it holds)."""
  module = interface.spec_of(cfg.kind).module(cfg)
  out, variables = module.apply({"params": params, "cache": cache}, tokens_BxL, decode=True, mutable=["cache"])
  return out, variables["cache"]


def at_position(cache: PyTree, position: jax.Array) -> PyTree:
  """The cache with every layer's next position set to `position` (entries after it are overwritten before any
  query reads them)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.asarray(position, x.dtype) if getattr(path[-1], "key", None) in ("index", "position")
      else x, cache)
