"""configs/pretrain_100m.py: valid against a prepared dataset's manifest, and one training step compiles on CPU."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

from configs import pretrain_100m
from models import lm
from runtime.config.run import from_config_dict
from runtime.data import manifest as manifest_lib
from runtime.train import optim, programs


def _manifest_of_a_32k_dataset(directory):
  """The fields a config reads of a prepared dataset (no shards: nothing here reads tokens)."""
  directory.mkdir(parents=True)
  (directory / manifest_lib.NAME).write_text(json.dumps(dict(
      format=manifest_lib.FORMAT, format_version=manifest_lib.VERSION, dtype="uint16", record_tokens=4096,
      tokenizer=dict(kind="sentencepiece", vocab_size=32768, eod_id=1, file="tokenizer.model"),
      splits={s: dict(documents=0, tokens=0, shards=[]) for s in manifest_lib.SPLITS})))


def _lowered_step(tmp_path, remat: bool) -> jax.stages.Lowered:
  """One training step of the config's model (with `remat`), on one sequence, lowered from abstract shapes."""
  _manifest_of_a_32k_dataset(tmp_path / "data")
  run = from_config_dict(pretrain_100m.get_config(str(tmp_path / "data")))
  model = run.model
  assert (model.vocab_size, model.dtype, model.num_layers, model.d_model) == (32768, "bfloat16", 12, 768)
  model = dataclasses.replace(run.model, remat=remat)
  tx = optim.inner_optimizer(run.inner, run.total_steps)
  state = jax.eval_shape(lambda: programs.init_state(lm.init_params(model, jax.random.key(0)), tx))
  batch = jax.ShapeDtypeStruct((1, run.data.seq_len + 1), jnp.int32)
  return jax.jit(programs.make_train_step(model, tx)).lower(state, batch)


def test_the_100m_config_takes_its_vocabulary_from_the_dataset_and_its_step_lowers_with_remat(tmp_path):
  text = _lowered_step(tmp_path, True).as_text()
  assert "tensor<32768x768xf32>" in text and "bf16" in text
  assert "optimization_barrier" in text  # what jax.checkpoint (nn.remat) lowers to


@pytest.mark.slow  # ~20 s: XLA compiles the 100m model's step on CPU
def test_one_step_of_the_100m_config_compiles_on_cpu(tmp_path):
  compiled = _lowered_step(tmp_path, True).compile()
  assert compiled.memory_analysis() is not None
