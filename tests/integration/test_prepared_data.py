"""Training on a dataset launch.prepare_data wrote: its vocabulary, a killed run resumed bit-identical, bad shards."""

import json
import math
import pathlib
import shutil

import pytest

from launcher import FAST, launch
from runtime.config.run import from_config_dict, with_fields
from runtime.errors import ConfigError
from test_resume import assert_resumes_bit_identical


# Slow (CI time, ~40 s each); the command-line test below trains on a prepared dataset in the default suite.
@pytest.mark.parametrize("assignment", [pytest.param("shards", marks=pytest.mark.slow),
                                        pytest.param("service", marks=pytest.mark.slow)])
def test_a_run_on_a_prepared_dataset_killed_and_resumed_ends_bit_identical(
    tiny_config, prepared_dataset, tmp_path, monkeypatch, assignment):
  tiny_config.data.path = str(prepared_dataset)
  tiny_config.data.assignment = assignment
  tiny_config.learners, tiny_config.num_devices = 2, 2
  tiny_config.total_steps, tiny_config.checkpoint_every = 24, 2  # 6 merges: Θ gets below uniform at outer lr 0.6
  result = assert_resumes_bit_identical(tiny_config, tmp_path, monkeypatch, kills=(2,))
  assert result.params["embed"]["embedding"].shape[0] == 512
  assert math.isfinite(result.final_eval_loss) and result.final_eval_loss < math.log(512)


def test_the_vocabulary_comes_from_the_manifest_and_a_conflicting_one_is_a_config_error(tiny_config, prepared_dataset):
  tiny_config.data.path = str(prepared_dataset)
  assert from_config_dict(tiny_config).model.vocab_size == 512
  byte_level = from_config_dict(_with_path(tiny_config))
  assert byte_level.model.vocab_size == 256
  assert with_fields(byte_level, {"data.path": str(prepared_dataset)}).model.vocab_size == 512
  tiny_config.model.vocab_size = 1000
  with pytest.raises(ConfigError, match=r"model.vocab_size' = 1000 is invalid: allowed 512 \(the vocabulary of"):
    from_config_dict(tiny_config)


def _with_path(config, path="stdlib"):
  config = config.copy_and_resolve_references()
  config.data.path = path
  return config


# The successful command line is slow (~25 s, its programs compiled for a 512-id vocabulary; CI budget).
@pytest.mark.parametrize("damaged", [pytest.param(False, marks=pytest.mark.slow), True])
def test_the_command_line_trains_on_a_prepared_dataset_and_refuses_a_damaged_shard(
    prepared_dataset, tmp_path, damaged):
  data = tmp_path / "data"
  shutil.copytree(prepared_dataset, data)
  victim = sorted(data.glob("train-*.array_record"))[-1]
  if damaged:
    raw = bytearray(victim.read_bytes())
    raw[100] ^= 1
    victim.write_bytes(bytes(raw))
  out = launch("train", "--config=smoke", *FAST, f"--config.data.path={data}", f"--workdir={tmp_path / 'run'}",
               cwd=tmp_path)
  if damaged:
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    (line,) = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert f"shard {victim.name} does not match its checksum" in line
    return
  assert out.returncode == 0, out.stderr[-3000:]
  (run_json,) = (tmp_path / "run").glob("*/run.json")
  assert json.loads(run_json.read_text())["config"]["model"]["vocab_size"] == 512
  (row,) = json.loads((tmp_path / "run" / "results.json").read_text())
  assert math.isfinite(row["eval_loss"]) and row["eval_loss"] < math.log(512)


@pytest.mark.slow  # ~1.5 minutes: a SentencePiece tokenizer trained, then two launches on its 512-id vocabulary
def test_a_small_corpus_trains_under_the_command_prepare_data_prints_with_smoke_and_default(tmp_path):
  import shlex  # pylint: disable=g-import-not-at-top
  import sysconfig  # pylint: disable=g-import-not-at-top
  email = pathlib.Path(sysconfig.get_paths()["stdlib"]) / "email"
  prepared = launch("prepare_data", f"--input={email}", f"--output={tmp_path / 'email'}", "--tokenizer=sentencepiece",
                    "--vocab_size=512", cwd=tmp_path)
  assert prepared.returncode == 0, prepared.stderr[-3000:]
  assert "eval split kept:" in prepared.stdout and "fewer than the 64 the default config evaluates on" in prepared.stdout
  (line,) = [l for l in prepared.stdout.splitlines() if l.startswith("train on it: ")]
  command = shlex.split(line.removeprefix("train on it: "))
  assert command[:3] == ["python", "-m", "launch.train"]
  quick = ["--config.learners=2", "--config.num_devices=2", "--config.total_steps=4", "--config.inner_steps=2",
           "--config.overlap_steps=1", "--config.eval_every=2", "--config.progress=False", "--config.tensorboard=False",
           FAST[-1]]
  for config in ("default", "smoke"):
    args = [f"--config={config}" if a.startswith("--config=") else a for a in command[3:]]
    out = launch("train", *args, *quick, f"--workdir={tmp_path / config}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "evaluating on" in out.stdout  # the windows there are, said in one line
    (row,) = json.loads((tmp_path / config / "results.json").read_text())
    assert math.isfinite(row["eval_loss"]) and row["eval_loss"] < math.log(512) + 1
