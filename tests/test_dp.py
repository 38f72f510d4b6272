"""The synchronous data-parallel baseline."""

import jax
import numpy as np

from runtime import train
from runtime.experiment import Experiment


def _run(config, workdir=None):
  run = train.prepare(config)
  return train.train_one(run, Experiment(run), workdir, "dp")


def test_dp_on_8_devices_matches_1_device_at_the_same_global_batch(tiny_config):
  tiny_config.mode = "dp"
  tiny_config.total_steps = 6
  tiny_config.num_devices = 8
  eight = _run(tiny_config)
  tiny_config.num_devices = 1
  one = _run(tiny_config)
  losses = lambda r: [x["loss"] for x in r.records if x["kind"] == "train"]
  assert len(losses(eight)) == 6
  np.testing.assert_allclose(losses(eight), losses(one), rtol=2e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), eight.params, one.params)


def test_dp_loss_falls_on_the_real_corpus_and_writes_metrics(tiny_config, tmp_path):
  tiny_config.mode = "dp"
  tiny_config.total_steps = 40
  tiny_config.eval_every = 20
  tiny_config.log_every = 5
  tiny_config.tensorboard = True
  result = _run(tiny_config, tmp_path)
  train_losses = [x["loss"] for x in result.records if x["kind"] == "train"]
  evals = [x["eval_loss"] for x in result.records if x["kind"] == "eval"]
  assert train_losses[0] > 5.0  # ~ln 256 at init
  assert result.final_eval_loss < train_losses[0] - 1.0
  assert evals == sorted(evals, reverse=True)
  assert (tmp_path / "dp" / "metrics.jsonl").stat().st_size > 0
  assert list((tmp_path / "dp" / "tb").iterdir())
