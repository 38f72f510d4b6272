"""Inner optimizer: AdamW with warmup + cosine decay and global-norm clipping."""

import functools
from typing import Callable

import jax
import optax

from runtime.config.run import InnerOptConfig


def inner_schedule(cfg: InnerOptConfig, total_steps: int) -> optax.Schedule:
  """Linear warmup to cfg.lr, then cosine decay to cfg.lr * cfg.min_lr_ratio at total_steps."""
  warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.lr, warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1), end_value=cfg.lr * cfg.min_lr_ratio)


def inner_lr(cfg: InnerOptConfig, total_steps: int) -> Callable[[int], float]:
  """`lr(n)`: the inner learning rate the step taken after `n` steps applies, evaluated on the host CPU."""
  schedule, cpu = inner_schedule(cfg, total_steps), jax.devices("cpu")[0]

  @functools.lru_cache(maxsize=None)  # learners at the same step ask alike; each eager evaluation costs ~1 ms
  def lr(steps_before: int) -> float:
    # For metrics records: evaluated on the host so no accelerator work joins the run's programs.
    with jax.default_device(cpu):
      return float(schedule(max(steps_before, 0)))

  return lr


def inner_optimizer(cfg: InnerOptConfig, total_steps: int) -> optax.GradientTransformation:
  """The learners' (and the DP baseline's) optimizer."""
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip),
      optax.adamw(inner_schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay),
  )
