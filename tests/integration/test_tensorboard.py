"""The event files a run writes read back with TensorBoard's own reader and command (the `tensorboard` extra)."""

import pathlib
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing import event_accumulator

from runtime.reporting.metrics import MetricsLogger


def _write_run(workdir: pathlib.Path) -> list[dict]:
  """Train records at tokens 100 and 200, then an eval record without tokens (at its step)."""
  with MetricsLogger(workdir, run="r", progress=False, tensorboard=True) as logger:
    logger.log("train", {"step": 1, "tokens": 100, "loss": 2.5, "lr": 1e-3, "learners": [0, 1]})
    logger.log("train", {"step": 2, "tokens": 200, "loss": 2.25, "lr": 2e-3, "note": "text"})
    logger.log("eval", {"step": 2, "eval_loss": 2.75})
    return logger.records


def test_scalars_round_trip_through_tensorboards_reader_at_tokens_and_wall_time(tmp_path: pathlib.Path):
  records = _write_run(tmp_path)

  reader = event_accumulator.EventAccumulator(str(tmp_path / "r" / "tb"))
  reader.Reload()
  assert sorted(reader.Tags()["scalars"]) == [
      "eval/eval_loss", "eval/step", "train/loss", "train/lr", "train/step", "train/tokens"]
  scalars = lambda tag: [(e.step, e.value) for e in reader.Scalars(tag)]
  assert scalars("train/loss") == [(100, 2.5), (200, 2.25)]
  assert scalars("train/lr") == [(100, pytest.approx(1e-3)), (200, pytest.approx(2e-3))]
  assert scalars("eval/eval_loss") == [(2, 2.75)]
  assert [e.wall_time for e in reader.Scalars("train/loss")] == pytest.approx([r["wall_time"] for r in records[:2]])


def test_tensorboard_command_inspects_the_logdir_and_lists_the_tags(tmp_path: pathlib.Path):
  _write_run(tmp_path)

  done = subprocess.run([sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path), "--inspect"],
                        capture_output=True, text=True, timeout=120, check=False)

  assert done.returncode == 0, done.stderr
  for tag in ("train/loss", "train/lr", "eval/eval_loss"):
    assert tag in done.stdout
  assert "wall_time" not in done.stdout
