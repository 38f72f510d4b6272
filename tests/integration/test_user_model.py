"""A model defined here, outside the runtime, trains by its import path in every DiLoCo mode and in DP."""

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn

from models import lm
from models.interface import ModelSpec
from runtime.errors import ConfigError
from runtime.experiments import modes
from runtime.train.harness import Experiment
from tests import launcher

named = nn.with_logical_partitioning


class PairModel(nn.Module):
  """Predicts the next byte from the current one and the one before it (a causal trigram model)."""

  cfg: object

  @nn.compact
  def __call__(self, tokens_BxL: jax.Array) -> jax.Array:
    cfg = self.cfg
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, name="embed",
                     embedding_init=named(nn.initializers.normal(0.1), ("vocab", "embed")))
    x_BxLxD = embed(tokens_BxL)
    before_BxLxD = jnp.pad(x_BxLxD, ((0, 0), (1, 0), (0, 0)))[:, :-1]
    h_BxLxF = nn.gelu(nn.Dense(cfg.mlp_dim, name="hidden")(jnp.concatenate([x_BxLxD, before_BxLxD], axis=-1)))
    return nn.Dense(cfg.vocab_size, name="out", kernel_init=named(nn.initializers.lecun_normal(), ("mlp", "vocab")))(
        h_BxLxF)


def label_smoothed(logits_BxLxV, targets_BxL, cfg):
  """A user's own objective: cross-entropy against targets smoothed by 0.1."""
  labels_BxLxV = 0.9 * jax.nn.one_hot(targets_BxL, cfg.vocab_size) + 0.1 / cfg.vocab_size
  return -(labels_BxLxV * jax.nn.log_softmax(logits_BxLxV)).sum(-1).mean()


spec = ModelSpec(PairModel, objective=label_smoothed)
KIND = "tests.integration.test_user_model:spec"  # its import path from the repository root


@pytest.mark.parametrize("mode", ["decoupled", "diloco_sync", "dp"])
def test_a_model_defined_in_this_file_trains_by_its_import_path_and_its_loss_falls(tiny_config, mode):
  tiny_config.model.kind = KIND
  tiny_config.mode = mode
  tiny_config.inner.lr, tiny_config.inner.warmup_steps = 1e-2, 2
  run = modes.prepare(tiny_config)
  assert run.model.num_params() == sum(x.size for x in jax.tree.leaves(lm.abstract_params(run.model)))
  result = modes.train_one(run, Experiment(run), None, mode)
  evals = [r["eval_loss"] for r in result.records if "eval_loss" in r]
  assert evals[-1] < 4.6 and evals[-1] < evals[0] - 0.3, evals  # ln 256 = 5.55: uniform over bytes
  assert set(result.params) == {"embed", "hidden", "out"}


def test_a_users_objective_is_what_training_minimizes():
  from models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig(kind=KIND, d_model=32, mlp_dim=64, max_len=16)
  params = lm.init_params(cfg, jax.random.key(0))
  batch = jax.random.randint(jax.random.key(1), (4, 17), 0, 256)
  objective, cross_entropy = lm.train_loss(params, cfg, batch)
  logits = lm.logits(params, cfg, batch[:, :-1])
  assert objective == label_smoothed(logits, batch[:, 1:], cfg) and objective != cross_entropy
  assert cross_entropy == lm.loss_fn(params, cfg, batch)  # what evaluations report


def test_a_user_model_places_its_named_axes_and_splits_the_others_under_fsdp():
  from models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  specs = lm.param_specs(ModelConfig(kind=KIND, d_model=32, mlp_dim=64), {"data": 2, "tensor": 2}, fsdp=True)
  assert tuple(specs["out"]["kernel"]) == ("tensor", "data")  # its first named axis ('mlp') across tensor
  assert tuple(specs["hidden"]["kernel"]) == (None, "data")  # no names: fsdp's largest axis only


@pytest.mark.parametrize("kind, says", [
    ("no_such_package.model:spec", "cannot be imported"),
    ("tests.integration.test_user_model:missing", "is not defined there"),
    ("tests.integration.test_user_model:PairModel", "a models.interface.ModelSpec"),
    ("transformer", "one of ['gpt', 'llama']"),
])
def test_a_kind_that_names_no_model_is_refused_naming_the_field(tiny_config, kind, says):
  tiny_config.model.kind = kind
  with pytest.raises(ConfigError, match="model.kind") as error:
    modes.prepare(tiny_config)
  assert says in str(error.value)


@pytest.mark.parametrize("mode", ["decoupled", "diloco_sync", "dp"])
def test_the_command_line_trains_a_users_model(tmp_path, mode):
  out = launcher.launch("train", "--config=configs/smoke.py", f"--config.model.kind={KIND}", f"--config.mode={mode}",
                        *launcher.FAST, f"--workdir={tmp_path}", cwd=launcher.REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  assert (tmp_path / mode / "model" / "model.json").is_file()
