"""The runtime's DiLoCo against an independent synchronous loop (tests/diloco_oracle.py) on the same batches."""

import jax
import numpy as np
import pytest
from diloco_oracle import synchronous_diloco

from models import lm
from runtime.experiments import modes
from runtime.train.harness import Experiment


def _oracle_theta(run, exp):
  inner, outer = run.inner, run.outer
  shards = [exp.shard(m, run.learners, run.learner_batch(m)) for m in range(run.learners)]
  streams = [[next(s) for _ in range(run.total_steps)] for s in shards]
  return synchronous_diloco(
      run.model, lm.init_params(run.model, jax.random.key(run.seed)), streams,
      rounds=run.total_steps // run.inner_steps, inner_steps=run.inner_steps, total_steps=run.total_steps,
      lr=inner.lr, warmup=inner.warmup_steps, end_ratio=inner.min_lr_ratio, b1=inner.b1, b2=inner.b2,
      weight_decay=inner.weight_decay, clip=inner.grad_clip, outer_lr=outer.lr, momentum=outer.momentum,
      method=outer.merge)


@pytest.mark.parametrize("mode,recipe", [
    ("diloco_sync", "default"),  # RDA, token weights, the default outer Nesterov step
    ("decoupled", "anchor"),  # K=1 at equal speeds merges every learner at once; QK-norm, z-loss, β2 0.99, mean
])
def test_the_runtimes_diloco_gives_the_oracles_theta_on_the_same_batches(tiny_config, mode, recipe):
  tiny_config.mode = mode
  tiny_config.learners = 2
  tiny_config.inner_steps = 4
  tiny_config.total_steps = 16
  tiny_config.inner.warmup_steps = 3
  if recipe == "anchor":
    tiny_config.model.qk_norm = True
    tiny_config.model.z_loss = 1e-2
    tiny_config.inner.b2 = 0.99
    tiny_config.inner.min_lr_ratio = 0.05
    tiny_config.outer.lr = 0.5
    tiny_config.outer.merge = "mean"
  run = modes.prepare(tiny_config)
  exp = Experiment(run)
  result = modes.train_one(run, exp, None, "run")
  assert result.extras["merges"] == 4 and result.extras["learners_per_merge"] == 2

  theta = _oracle_theta(run, exp)
  initial = lm.init_params(run.model, jax.random.key(run.seed))
  moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), theta, initial)
  assert min(jax.tree.leaves(moved)) > 1e-3  # every tensor trained: the comparison below is not of two inits
  jax.tree.map(lambda ours, oracle: np.testing.assert_allclose(np.asarray(ours), oracle, rtol=2e-4, atol=2e-5),
               result.params, theta)
