"""What a run's records and summary say about it: wall time, inner learning rate, per-learner loss, time kind."""

import collections

import numpy as np
import pytest

from runtime.experiments import modes
from runtime.train.harness import Experiment, RunResult, make_logger, run_time_kind
from runtime.train.optim import inner_schedule


def _run(config, name="run"):
  run = modes.prepare(config)
  return run, modes.train_one(run, Experiment(run), None, name)


def test_dp_train_records_carry_the_inner_lr_their_step_applied_and_increasing_wall_times(tiny_config):
  tiny_config.mode = "dp"
  tiny_config.total_steps = 8
  tiny_config.inner.warmup_steps = 4
  run, result = _run(tiny_config, "dp")

  train = [r for r in result.records if r["kind"] == "train"]
  schedule = inner_schedule(run.inner, run.total_steps)
  assert [r["step"] for r in train] == list(range(1, 9))
  # Step s applies the schedule after s - 1 steps: the warmup starts at 0 and peaks at step 5.
  assert [r["lr"] for r in train] == pytest.approx([float(schedule(r["step"] - 1)) for r in train])
  assert train[0]["lr"] == 0.0 and train[4]["lr"] == pytest.approx(run.inner.lr)
  wall_times = [r["wall_time"] for r in result.records]
  assert wall_times == sorted(wall_times) and result.time_kind == "modeled"


def test_merge_records_give_each_merged_learners_round_loss_and_inner_lr(tiny_config):
  tiny_config.inner.warmup_steps = 6
  run, result = _run(tiny_config)

  merges = [r for r in result.records if r["kind"] == "merge"]
  schedule = inner_schedule(run.inner, run.total_steps)
  rounds = collections.Counter()
  assert merges
  for merge in merges:
    assert len(merge["losses"]) == len(merge["lr"]) == len(merge["merged"]) == merge["num_merged"]
    assert merge["loss"] == float(np.mean(merge["losses"]))
    rounds.update(merge["merged"])
    # Without faults or overlap, a learner's k-th merged report ends its k·H-th inner step.
    expected = [float(schedule(rounds[m] * run.inner_steps - 1)) for m in merge["merged"]]
    assert merge["lr"] == pytest.approx(expected)
  assert len({loss for merge in merges for loss in merge["losses"]}) > 1


@pytest.mark.parametrize("clock, time_kind", [("virtual", "modeled"), ("real", "wall")])
def test_progress_bar_of_a_run_labels_modeled_tokens_per_second_only_under_the_virtual_clock(tiny_config, clock,
                                                                                             time_kind, capsys):
  tiny_config.clock.kind = clock
  tiny_config.progress = True
  run = modes.prepare(tiny_config)
  assert run_time_kind(run) == time_kind

  with make_logger(run, None, "run") as logger:
    logger.log("train", {"tokens": 100, "time": 1.0, "loss": 2.0})

  bar = capsys.readouterr().err.split("\r")[-1]
  assert ("modeled tok/s=100" in bar) == (time_kind == "modeled") and ("modeled" in bar) == (time_kind == "modeled")


def test_summary_row_names_modeled_seconds_and_wall_clock_tokens_per_second():
  result = RunResult(run="r", mode="dp", tokens=1000, final_eval_loss=2.0, wall_seconds=4.0, virtual_seconds=10.0,
                     tokens_per_second=250.0)

  row = result.row()
  assert (row["modeled_s"], row["tokens_per_wall_s"], row["wall_s"]) == (10.0, 250.0, 4.0)
  assert not {"virtual_s", "tokens_per_s"} & set(row)
