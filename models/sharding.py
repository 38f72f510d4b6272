"""Where a model's tensors live on a learner's (or DP's) mesh, by logical axis names (flax's logical-axis rules).

Parameters carry their names from their initializers (`flax.linen.with_logical_partitioning`; models/lm.py places
them); activations are placed with `constrain`, a no-op unless a program traces the model under `placed` on a mesh
with a 'tensor' axis wider than 1. A user's model may call `constrain` too.
"""

import contextlib
import contextvars
from typing import Any

import jax
from flax import linen as nn
from jax.sharding import Mesh

# Logical axes split across a mesh's 'tensor' axis (tensor parallelism): for a parameter, the first of them in its
# order whose size the width divides (models/lm.py param_specs); for an activation, each one named.
TENSOR_RULES = (("heads", "tensor"), ("kv_heads", "tensor"), ("mlp", "tensor"), ("vocab", "tensor"))
_MESH: contextvars.ContextVar = contextvars.ContextVar("activation_mesh", default=None)


def activation_rules(mesh: Mesh) -> tuple[tuple[str, Any], ...]:
  """flax logical-axis rules for activations on `mesh`: the batch across its batch axes ('slice' and 'data'), the
  axes of TENSOR_RULES across 'tensor', every other axis replicated."""
  batch = tuple(a for a in mesh.axis_names if a in ("slice", "data"))
  return (("batch", batch if len(batch) > 1 else batch[0]), *TENSOR_RULES)


@contextlib.contextmanager
def _placed_on(mesh: Mesh):
  token = _MESH.set(mesh)
  try:
    with nn.logical_axis_rules(activation_rules(mesh)):
      yield
  finally:
    _MESH.reset(token)


def placed(mesh: Mesh | None):
  """The context a program traces its model in: activations placed by activation_rules on a mesh with a 'tensor'
  axis wider than 1; nothing otherwise (XLA propagates the parameters' and the batch's shardings)."""
  if mesh is None or dict(mesh.shape).get("tensor", 1) == 1:
    return contextlib.nullcontext()
  return _placed_on(mesh)


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
  """`x` constrained to the sharding its logical axis `names` map to (flax.linen.with_logical_constraint) while a
  program traces under `placed`; unchanged otherwise."""
  mesh = _MESH.get()
  return x if mesh is None else nn.with_logical_constraint(x, names, mesh=mesh)
