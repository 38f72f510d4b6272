"""The model interface: what the runtime, the baselines and runtime/trained/ need of a model, and nothing else.

A model is a `ModelSpec`: a flax module built from the JAX-free `ModelConfig` that maps token ids [B, L] to
next-token logits [B, L, vocab], with optionally its own training objective, and whether it samples with a KV cache
(its `__call__` takes `decode=True`, as the built-in models' do). Each parameter may carry logical axis names
(`flax.linen.with_logical_partitioning`: 'embed', 'vocab', 'mlp', 'heads', 'kv_heads', 'head_dim', 'length'), which
place it on a learner's (fsdp, tensor) mesh (models/lm.py); a parameter without names is split along its largest
axis under fsdp and replicated across tensor. `model.kind` selects one: 'gpt', 'llama', or a user's
'package.module:attribute' naming a ModelSpec (docs/model.md has a complete example). A model may place its
activations by the same names (models/sharding.py `constrain`).
"""

import dataclasses
import functools
import importlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from models.config import ModelConfig

PyTree = Any
Objective = Callable[[jax.Array, jax.Array, ModelConfig], jax.Array]


class ModelKindError(ValueError):
  """`model.kind` names no model: the message says what was found instead (runtime/config turns it into a
  ConfigError naming the field)."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A model the runtime can train, evaluate, save and sample.

  module: ModelConfig -> a flax module; `module(cfg).apply({'params': p}, tokens_BxL)` is the logits [B, L, V].
  objective: (logits_BxLxV, targets_BxL, cfg) -> the scalar that training minimizes; None = the cross-entropy plus
    cfg.z_loss × mean (log Z)². Evaluations always report the plain cross-entropy, so every model is comparable.
  decodes: the module takes `decode=True` and keeps a KV cache in the 'cache' collection (models/attention.py);
    otherwise sampling recomputes the window for each token.
  """

  module: Callable[[ModelConfig], nn.Module]
  objective: Objective | None = None
  decodes: bool = False


def _gpt(cfg: ModelConfig) -> nn.Module:
  from models.transformer import TransformerLM  # pylint: disable=g-import-not-at-top
  return TransformerLM(cfg)


def _llama(cfg: ModelConfig) -> nn.Module:
  from models.llama import LlamaLM  # pylint: disable=g-import-not-at-top
  return LlamaLM(cfg)


BUILTIN = {"gpt": ModelSpec(_gpt, decodes=True), "llama": ModelSpec(_llama, decodes=True)}


@functools.lru_cache(maxsize=None)
def spec_of(kind: str) -> ModelSpec:
  """The model `kind` names: a built-in one, or the ModelSpec at 'package.module:attribute'."""
  if kind in BUILTIN:
    return BUILTIN[kind]
  module_name, _, attribute = kind.partition(":")
  if not module_name or not attribute:
    raise ModelKindError(f"one of {sorted(BUILTIN)}, or a user's model as 'package.module:attribute'")
  try:
    found = getattr(importlib.import_module(module_name), attribute)
  except ImportError as error:
    raise ModelKindError(f"an importable module ({module_name!r} cannot be imported: {error})") from None
  except AttributeError:
    raise ModelKindError(f"an attribute of {module_name!r} ({attribute!r} is not defined there)") from None
  if not isinstance(found, ModelSpec):
    raise ModelKindError(f"a models.interface.ModelSpec ({kind!r} is a {type(found).__name__})")
  return found


def boxed_init(cfg: ModelConfig, rng: jax.Array) -> PyTree:
  """The module's initial parameters with their logical-axis boxes (flax's LogicallyPartitioned)."""
  return spec_of(cfg.kind).module(cfg).init(rng, jnp.zeros((1, cfg.max_len), jnp.int32))["params"]


def logical_axes(cfg: ModelConfig) -> PyTree:
  """Each parameter's logical axis names, a PartitionSpec of names (or of None where it has none)."""
  return nn.get_partition_spec(jax.eval_shape(functools.partial(boxed_init, cfg), jax.random.key(0)))


@functools.lru_cache(maxsize=None)
def counted(cfg: ModelConfig) -> tuple[int, int]:
  """(parameter tensors, parameter scalars) of the model, from its abstract tree."""
  leaves = jax.tree.leaves(nn.meta.unbox(jax.eval_shape(functools.partial(boxed_init, cfg), jax.random.key(0))))
  return len(leaves), sum(int(x.size) for x in leaves)

