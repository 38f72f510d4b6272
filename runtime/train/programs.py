"""Pure training and evaluation programs; callers jit them with explicit shardings."""

import functools
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax

from jax.sharding import Mesh

from models.lm import loss_fn, train_loss
from models.config import ModelConfig
from models.sharding import placed

PyTree = Any


@flax.struct.dataclass
class TrainState:
  """Parameters and inner optimizer state of one model replica."""

  step: jax.Array
  params: PyTree
  opt_state: PyTree


def init_state(params: PyTree, tx: optax.GradientTransformation, step: int | jax.Array = 0) -> TrainState:
  """A fresh inner state around `params` whose learning-rate schedule stands at `step`.

  The moments (and Adam's bias correction) restart; the schedule continues, so a learner that rejoins
  or is reset does not warm up and decay again.
  """
  step = jnp.asarray(step, jnp.int32)
  return TrainState(step=step, params=params, opt_state=schedule_at(tx.init(params), step))


def schedule_at(opt_state: PyTree, step: jax.Array) -> PyTree:
  """`opt_state` with every schedule's count set to `step`."""
  is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)
  return jax.tree.map(lambda x: optax.ScaleByScheduleState(count=step) if is_schedule(x) else x, opt_state,
                      is_leaf=is_schedule)


@functools.partial(jax.jit, donate_argnums=0)
def schedule_to(state: TrainState, step: jax.Array) -> TrainState:
  """`state` with its inner schedule set to `step` (its buffers donated)."""
  return state.replace(opt_state=schedule_at(state.opt_state, step))


def make_train_step(cfg: ModelConfig, tx: optax.GradientTransformation,
                    step_hook: Callable[[jax.Array], jax.Array] | None = None, mesh: Mesh | None = None) -> Callable:
  """(state, batch_BxT) -> (state, {loss, grad_norm}): one AdamW step.

  `step_hook(step) -> step` runs first in every step (fault injection calls the host there). On a `mesh` with a
  'tensor' axis, the model's activations are placed by their logical axes (models/sharding.py `placed`).
  """

  def train_step(state: TrainState, batch_BxT: jax.Array) -> tuple[TrainState, dict]:
    if step_hook is not None:
      state = state.replace(step=step_hook(state.step))
    with placed(mesh):
      (_, loss), grads = jax.value_and_grad(train_loss, has_aux=True)(state.params, cfg, batch_BxT)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

  return train_step


def make_round(cfg: ModelConfig, tx: optax.GradientTransformation,
               step_hook: Callable[[jax.Array], jax.Array] | None = None, copy_params: bool = False,
               mesh: Mesh | None = None) -> Callable:
  """(state, batches_HxBxT) -> (state, {loss_H, grad_norm_H}): H inner steps as one device program.

  With `copy_params` it also returns a copy of the final parameters that shares no buffer with the state: a report
  taken inside the part that ends in it, so that the part queued behind may donate the state.
  """
  train_step = make_train_step(cfg, tx, step_hook, mesh)

  def run_round(state: TrainState, batches_HxBxT: jax.Array) -> tuple:
    state, metrics = jax.lax.scan(train_step, state, batches_HxBxT)
    return (state, metrics, jax.tree.map(jnp.copy, state.params)) if copy_params else (state, metrics)

  return run_round


def make_eval(cfg: ModelConfig) -> Callable:
  """(params, batches_NxBxT) -> mean loss over N fixed held-out batches."""

  def evaluate(params: PyTree, batches_NxBxT: jax.Array) -> jax.Array:
    return jax.lax.map(lambda b: loss_fn(params, cfg, b), batches_NxBxT).mean()

  return evaluate
