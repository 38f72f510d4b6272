"""SIGTERM and SIGINT: the run saves its state as it stands, stops with one line, and resumes as if never stopped."""

import json
import random
import re
import signal
import time

import jax
import numpy as np
import pytest

from runtime.diloco import merge_schedule
from runtime.diloco import rounds as rounds_lib
from runtime.experiments import modes
from runtime.train import preemption
from test_checkpoint import _records, _start
from test_resume import DECOUPLED, _assert_tiles, _final_theta, _metrics, _run_dir
from test_resume import faulty  # pylint: disable=unused-import  # (the fixture)


def _signal_at_part(monkeypatch, part: int, signum: int) -> None:
  """The signal arrives as the controller handles the `part`-th part done: mid-round, between two merges."""
  on_part_done, seen = rounds_lib.Rounds.on_part_done, []

  def and_signal(self, event, now):
    on_part_done(self, event, now)
    seen.append(1)
    if len(seen) == part:
      preemption._requested.append(signum)  # pylint: disable=protected-access  # (what the handler records)

  monkeypatch.setattr(rounds_lib.Rounds, "on_part_done", and_signal)


@pytest.fixture
def calm(tiny_config):
  """Two learners with overlap, reports and Θ on their way: a few seconds' run."""
  tiny_config.learners, tiny_config.num_devices = 2, 2
  tiny_config.total_steps, tiny_config.inner_steps, tiny_config.overlap_steps = 8, 2, 1
  tiny_config.eval_every = 8
  tiny_config.outer.quorum = 1
  tiny_config.clock.latency_s = 0.3
  return tiny_config


@pytest.mark.slow  # ~22 s (calm) and ~2 min (faulty): over the CI budget; the SIGINT case below stays in it
@pytest.mark.parametrize("setting,part", [
    ("calm", 5),
    ("faulty", 23),  # crashes, a straggler, a quarantine, a dropped report
])
def test_a_sigterm_mid_round_saves_at_once_and_the_resumed_run_ends_bit_identical(setting, part, request, tmp_path,
                                                                                monkeypatch):
  config = request.getfixturevalue(setting)
  config.checkpoint_every = 1000  # no periodic save: the signal's is the only one before the end
  reference = modes.train(config, tmp_path / "reference")[0]
  with monkeypatch.context() as patch:
    _signal_at_part(patch, part, signal.SIGTERM)
    with pytest.raises(preemption.Interrupted) as stopped:
      modes.train(config, tmp_path / "stopped")
    preemption._requested.clear()  # pylint: disable=protected-access
  assert stopped.value.exit_code == 143
  message = str(stopped.value)
  assert re.fullmatch(r"interrupted at merge (\d+) \([\d,]+ tokens merged\); checkpoint \1 saved; run the same "
                      r"command to resume", message), message
  saved = sorted(p.name for p in (tmp_path / "stopped" / "decoupled" / "checkpoints").iterdir())
  assert saved == [re.match(r"interrupted at merge (\d+)", message).group(1)]
  result = modes.train(config, tmp_path / "stopped")[0]
  assert _metrics(tmp_path / "stopped") == _metrics(tmp_path / "reference")
  for a, b in zip(jax.tree.leaves(reference.params), jax.tree.leaves(result.params), strict=True):
    np.testing.assert_array_equal(a, b)


def test_a_sigterm_while_a_merge_runs_stops_once_it_is_done_and_the_resumed_run_ends_bit_identical(
    calm, tmp_path, monkeypatch):
  """Regression (a real-clock stop flaked): a signal while the merge worker runs saved the merge's future, which no
  checkpoint can hold (TypeError). The merge is finished and handled first; then the state is saved, whole."""
  calm.checkpoint_every = 1000
  reference = modes.train(calm, tmp_path / "reference")[0]
  on_merge_due, seen = merge_schedule.MergeSchedule.on_merge_due, []

  def and_signal(self, event):
    on_merge_due(self, event)
    if self.state == merge_schedule.RUNNING and not seen:
      seen.append(1)
      preemption._requested.append(signal.SIGTERM)  # pylint: disable=protected-access

  with monkeypatch.context() as patch:
    patch.setattr(merge_schedule.MergeSchedule, "on_merge_due", and_signal)
    with pytest.raises(preemption.Interrupted):
      modes.train(calm, tmp_path / "stopped")
    preemption._requested.clear()  # pylint: disable=protected-access
  result = modes.train(calm, tmp_path / "stopped")[0]
  assert seen and _metrics(tmp_path / "stopped") == _metrics(tmp_path / "reference")
  for a, b in zip(jax.tree.leaves(reference.params), jax.tree.leaves(result.params), strict=True):
    np.testing.assert_array_equal(a, b)


def test_a_sigint_without_checkpoints_stops_with_one_line_saying_the_run_cannot_resume(calm, tmp_path, monkeypatch):
  calm.checkpoint_every = 0
  _signal_at_part(monkeypatch, 3, signal.SIGINT)
  with pytest.raises(preemption.Interrupted) as stopped:
    modes.train(calm, tmp_path / "stopped")
  preemption._requested.clear()  # pylint: disable=protected-access
  assert stopped.value.exit_code == 130
  assert "checkpoints are off" in str(stopped.value) and "\n" not in str(stopped.value)


@pytest.mark.slow  # ~10 minutes: twenty kills of real-clock runs, each resumed with the same command
def test_twenty_sigkills_and_sigterms_of_a_real_clock_run_lose_nothing_and_merge_nothing_twice(tmp_path):
  """Under the real clock the promise is not bit identity but this: every merged data range tiles each learner's
  stream from its start (nothing merged before the last checkpoint lost, nothing merged twice), and the run ends."""
  args = [*DECOUPLED, "--config.clock.kind=real", "--config.total_steps=60", "--config.checkpoint_every=1",
          "--config.faults.schedule=crash:learner=1,step=20;corrupt:learner=0,time=3,how=nan;"
          "link:learner=2,time=2,duration=2,mode=drop", "--config.faults.report_timeout_seconds=2"]
  rng, kills, terms, runs = random.Random(7), 0, 0, 0
  while kills < 20:
    workdir, runs = tmp_path / f"run{runs}", runs + 1
    while kills < 20:
      process = _start([*args, f"--workdir={workdir}"], tmp_path)
      time.sleep(rng.uniform(3.0, 12.0))
      if process.poll() is not None:
        break  # it finished first
      how = rng.choice((signal.SIGKILL, signal.SIGTERM))
      process.send_signal(how)
      code = process.wait(timeout=300)
      assert code in ((-signal.SIGKILL,) if how == signal.SIGKILL else (143, 0)), code
      kills, terms = kills + 1, terms + (how == signal.SIGTERM)
    finished = _start([*args, f"--workdir={workdir}"], tmp_path)
    assert finished.wait(timeout=600) == 0
    _, meta = _final_theta(workdir)
    _assert_tiles(meta)
    merged = sum(b - a for _, a, b in meta["log"]["merged_ranges"])
    assert merged > 0
    for line in (_run_dir(workdir) / "metrics.jsonl").read_text().splitlines():
      json.loads(line)  # every record whole
  print(f"{kills} kills ({terms} SIGTERM) over {runs} runs")


@pytest.mark.slow  # ~10 s: over the CI budget
def test_a_sigterm_stops_data_parallel_training_after_its_step_and_it_resumes_bit_identical(tiny_config, tmp_path,
                                                                                          monkeypatch):
  from runtime.baselines import dp  # pylint: disable=g-import-not-at-top
  tiny_config.mode, tiny_config.total_steps, tiny_config.checkpoint_every = "dp", 8, 1000
  reference = modes.train(tiny_config, tmp_path / "reference")[0]
  finish_step, steps = dp._finish_step, []  # pylint: disable=protected-access

  def and_signal(logger, run, step, *args):
    finish_step(logger, run, step, *args)
    if step == 3 and not steps:
      steps.append(step)
      preemption._requested.append(signal.SIGTERM)  # pylint: disable=protected-access

  with monkeypatch.context() as patch:
    patch.setattr(dp, "_finish_step", and_signal)
    with pytest.raises(preemption.Interrupted) as stopped:
      modes.train(tiny_config, tmp_path / "stopped")
    preemption._requested.clear()  # pylint: disable=protected-access
  assert re.fullmatch(r"interrupted at step (\d+) \([\d,]+ tokens\); checkpoint \1 saved; run the same command to "
                      r"resume", str(stopped.value)), str(stopped.value)
  result = modes.train(tiny_config, tmp_path / "stopped")[0]
  assert _records(tmp_path / "stopped") == _records(tmp_path / "reference")  # (dp's records have wall seconds)
  for a, b in zip(jax.tree.leaves(reference.params), jax.tree.leaves(result.params), strict=True):
    np.testing.assert_array_equal(a, b)
