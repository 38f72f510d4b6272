"""The trained model as a run's output: saved bit for bit, loaded in one call, sampled, evaluated, refused when bad."""

import json
import shutil

import jax
import numpy as np
import pytest

from runtime.trained import load_model
from launcher import launch
from models import lm
from runtime.errors import DataError
from runtime.experiments import modes
from runtime.trained import evaluation, sampling, saved


def _equal(a, b) -> bool:
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(leaves_a) == len(leaves_b) and all(np.array_equal(x, y) for x, y in zip(leaves_a, leaves_b))


@pytest.fixture(scope="module")
def trained(make_tiny_config, tmp_path_factory):
  """A tiny Decoupled DiLoCo run with checkpoints every merge and a model every 2; Θ recorded after each merge."""
  config = make_tiny_config()
  config.checkpoint_every, config.checkpoint_keep, config.save_model_every = 1, 10, 2
  after_merge = {}
  merged = saved.Trail.merged

  def recording(self, merges, params, *args):
    merged(self, merges, params, *args)
    after_merge[merges] = jax.device_get(params)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(saved.Trail, "merged", recording)
    workdir = tmp_path_factory.mktemp("trained")
    result = modes.train(config, workdir)[0]
  return result, workdir / "decoupled", after_merge


def test_the_saved_model_is_the_final_theta_bit_for_bit_and_any_merge_loads_as_that_merges_theta(trained):
  result, run_dir, after_merge = trained
  config, params, tokenizer = load_model(run_dir)
  assert _equal(params, result.params) and _equal(params, after_merge[max(after_merge)])
  assert config.d_model == 32 and tokenizer.kind == "byte"
  record = json.loads((run_dir / "model" / "model.json").read_text())
  assert record["tokens"] == result.tokens and record["eval_loss"] == result.final_eval_loss
  assert record["digest"] == saved.digest(params)
  for merge in (1, 2):
    assert _equal(load_model(run_dir, merge=merge).params, after_merge[merge])
  assert _equal(load_model(run_dir / "models" / "merge-2").params, after_merge[2])
  assert not _equal(after_merge[1], after_merge[2])
  with pytest.raises(DataError, match=r"no checkpoint 99 under .*: allowed one of \[1, 2, 3, 4, 5\]"):
    load_model(run_dir, merge=99)


def test_evaluating_the_runs_own_batches_reproduces_its_final_eval_loss(trained):
  result, run_dir, _ = trained
  model = load_model(run_dir)
  row = evaluation.evaluate(model, windows="run", progress=False)
  assert abs(row["loss"] - result.final_eval_loss) < 1e-4
  everything = evaluation.evaluate(model, max_windows=64, progress=False)
  assert everything["tokens"] == 64 * 32 and 0 < everything["bits_per_byte"] < 8
  assert everything["bits_per_byte"] == pytest.approx(everything["loss"] / np.log(2))  # bytes: one per token


def test_a_held_out_text_is_scored_whole_with_split_all_and_a_prepared_dataset_is_refused(trained, text_input,
                                                                                            prepared_dataset):
  _, run_dir, _ = trained
  model = load_model(run_dir)
  files = sorted(text_input.glob("*.py"))  # (the glob below: the folder's own files, not its subfolder's)
  whole = sum(len(f.read_bytes()) for f in files) + len(files) - 1  # the files joined by the separator
  row = evaluation.evaluate(model, str(text_input / "*.py"), split="all", progress=False)
  seq_len = model.record["data"]["seq_len"]
  assert row["tokens"] == whole // (seq_len + 1) * seq_len  # every window of every file, none held back
  held = evaluation.evaluate(model, str(text_input / "*.py"), split="eval", progress=False)
  assert held["tokens"] < row["tokens"] / 4
  with pytest.raises(DataError, match="--split=all reads a text path whole: .* is a prepared dataset, which keeps its own split"):
    evaluation.evaluate(model, str(prepared_dataset), split="all", progress=False)


def test_sampling_is_deterministic_for_a_seed_and_greedy_sampling_follows_the_full_forward_pass(trained):
  _, run_dir, _ = trained
  cfg, params, tokenizer = load_model(run_dir)
  one, again, other = (sampling.generate(cfg, params, tokenizer, "def ", tokens=40, seed=s, stop_at_end=False)
                       for s in (0, 0, 1))
  assert one["text"] == again["text"] and one["ids"] == again["ids"] and one["ids"] != other["ids"]
  assert one["text"].startswith("def ") and len(one["ids"]) == 40
  forward = jax.jit(lambda p, x: lm.logits(p, cfg, x))
  prompt = "import os, sys\nfrom typing im"  # 30 tokens: the window slides past max_len = 32 at once
  window = sampling.generate(cfg, params, tokenizer, prompt, tokens=8, temperature=0.0, stop_at_end=False, cache=False)
  ids = list(prompt.encode())
  for _ in range(8):  # the whole (unpadded) context each time
    ids.append(int(np.argmax(forward(params, np.asarray([ids[-cfg.max_len:]], np.int32))[0, -1])))
  assert window["ids"] == ids[len(prompt):]
  prompt = "import os"  # with the cache: the same tokens as the full forward pass while they fit in max_len
  cached = sampling.generate(cfg, params, tokenizer, prompt, tokens=24, temperature=0.0, stop_at_end=False)
  ids = list(prompt.encode())
  for _ in range(24):
    ids.append(int(np.argmax(forward(params, np.asarray([ids], np.int32))[0, -1])))
  assert cached["ids"] == ids[len(prompt):] and len(ids) == cfg.max_len + 1
  assert sampling.generate(cfg, params, tokenizer, prompt, tokens=60, seed=3, stop_at_end=False)["ids"][:24] == (
      sampling.generate(cfg, params, tokenizer, prompt, tokens=60, seed=3, stop_at_end=False, cache=False)["ids"][:24])
  with pytest.raises(DataError, match="--prompt is 40 tokens long: allowed at most the model's max_len"):
    sampling.generate(cfg, params, tokenizer, "x" * 40, tokens=1)


def test_a_model_whose_arrays_do_not_match_its_digest_is_refused(trained, tmp_path):
  _, run_dir, _ = trained
  copy = tmp_path / "model"
  shutil.copytree(run_dir / "model", copy)
  record = json.loads((copy / "model.json").read_text())
  (copy / "model.json").write_text(json.dumps(dict(record, digest="0" * 64)))
  with pytest.raises(DataError, match="do not match the digest in model.json"):
    load_model(copy)


# (launcher, arguments, what the one line names); RUN is the trained run's directory, DATA a prepared dataset.
BAD = [
    ("sample", ["--model=NOWHERE"], "no model in"),
    ("evaluate", ["--model=RUN", "--data=DATA"], "was tokenized with sentencepiece (512 ids), the model with byte"),
    ("evaluate", ["--model=RUN", "--data=BINARY"], "holds no text: its 2 file(s) are binary"),
]


@pytest.mark.parametrize("module,args,named", BAD, ids=[f"{m}:{a[-1][:20]}" for m, a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(trained, prepared_dataset, tmp_path, module, args, named):
  _, run_dir, _ = trained
  binary = tmp_path / "binary"
  binary.mkdir()
  (binary / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 8)
  (binary / "noise.bin").write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
  swap = {"NOWHERE": str(tmp_path / "nowhere"), "RUN": str(run_dir), "DATA": str(prepared_dataset),
          "BINARY": str(binary)}
  args = [a.split("=")[0] + "=" + swap.get(a.split("=", 1)[1], a.split("=", 1)[1]) for a in args]
  out = launch(module, *args, cwd=tmp_path)
  assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and named in errors[0], out.stderr[-2000:]


def test_evaluate_scores_a_model_whose_path_holds_a_comma_as_run_names_do(trained, tmp_path):
  _, run_dir, _ = trained
  model = tmp_path / "decoupled,outer.quorum=2" / "model"
  shutil.copytree(run_dir / "model", model)
  out = launch("evaluate", f"--model={model}", "--max_windows=8", "--progress=false", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-2000:]
  assert str(model) in out.stdout


def test_a_run_in_a_relative_workdir_saves_its_model_there(make_tiny_config, tmp_path, monkeypatch):
  """The launchers' default workdirs are relative (workdirs/...); orbax writes only to absolute paths."""
  monkeypatch.chdir(tmp_path)
  config = make_tiny_config()
  config.total_steps = 4
  result = modes.train(config, "workdirs/relative")[0]
  _, params, _ = load_model(tmp_path / "workdirs" / "relative" / "decoupled")
  assert _equal(params, result.params)
