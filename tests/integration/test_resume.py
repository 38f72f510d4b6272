"""Decoupled DiLoCo killed and resumed from its checkpoints: in virtual time it ends as if never killed."""

import json
import pathlib
import random
import time

import jax
import numpy as np
import pytest

from invariants import assert_ranges_tile
from launcher import FAST, launch
from runtime.experiments import modes
from runtime.checkpoint.store import DIGEST, Checkpoints
from runtime.diloco import durability as durability_lib
from runtime.reporting.metrics import without_wall_time
from test_checkpoint import _kill_after_first_checkpoint, _killed_then_resumed

# A crash inside a round (its program fails on the device), a straggler, a corrupt (quarantined) report, a link
# that drops a report; K=2 of 3 learners with overlap: reports in transit, Θ on its way and programs in flight.
FAULTS = ("crash:learner=1,time=9;straggler:learner=2,time=3,duration=12,factor=3;corrupt:learner=0,time=14,how=nan;"
          "link:learner=2,time=20,duration=4,mode=drop;crash:learner=0,time=27.8,repair=3")


class _Killed(Exception):
  """The controller stopped as a kill would stop it (after its checkpoints so far are written)."""


@pytest.fixture
def faulty(tiny_config):
  tiny_config.learners = 3
  tiny_config.num_devices = tiny_config.slices = 4  # one spare slice
  tiny_config.data.batch_size = 12
  tiny_config.total_steps = 24
  tiny_config.inner_steps, tiny_config.overlap_steps = 2, 1  # both parts one step: one program per slice
  tiny_config.outer.quorum = 2
  tiny_config.clock.latency_s = 0.3  # reports and Θ spend time on their way
  tiny_config.faults.schedule = FAULTS
  tiny_config.faults.repair_seconds = 6.0
  tiny_config.faults.report_timeout_seconds = 3.0
  tiny_config.checkpoint_every = 1
  return tiny_config


def _run_dir(workdir: pathlib.Path) -> pathlib.Path:
  """The one run in `workdir` (launchers name it by its mode and overridden fields)."""
  (run_json,) = workdir.glob("*/run.json")
  return run_json.parent


def _metrics(workdir: pathlib.Path) -> str:
  return without_wall_time((_run_dir(workdir) / "metrics.jsonl").read_text())


def _kill_at(monkeypatch, merges: int) -> None:
  """The next run dies as it is about to save the checkpoint of merge `merges` (so that merge is done again)."""
  save = durability_lib.Durability.save

  def dying(self, step):
    if step == merges:
      raise _Killed()
    save(self, step)

  monkeypatch.setattr(durability_lib.Durability, "save", dying)


def assert_resumes_bit_identical(config, tmp_path, monkeypatch, kills, reference_config=None):
  """Trains `config` once (or `reference_config`, one known to train the same bits), and once killed before the
  checkpoint of each merge in `kills` and resumed each time: the same records and Θ; returns the resumed run's
  result."""
  reference = modes.train(reference_config or config, tmp_path / "reference")[0]
  for merge in kills:
    with monkeypatch.context() as patch:
      _kill_at(patch, merge)
      with pytest.raises(_Killed):
        modes.train(config, tmp_path / "killed")
  result = modes.train(config, tmp_path / "killed")[0]
  assert _metrics(tmp_path / "killed") == _metrics(tmp_path / "reference")
  for a, b in zip(jax.tree.leaves(reference.params), jax.tree.leaves(result.params), strict=True):
    np.testing.assert_array_equal(a, b)
  return result


@pytest.mark.slow  # ~2 minutes; the default suite keeps in-process kills (tests/integration/test_program_errors.py,
# test_feature_matrix.py) and tests/integration/test_membership.py's
def test_killed_mid_flight_four_times_the_run_ends_bit_identical_to_one_never_killed(faulty, tmp_path, monkeypatch):
  reference = modes.train(faulty, tmp_path / "reference")[0]
  saw = set()
  # Resumed from merge 5 (a learner down, its repair and a spare's rejoin due), merge 9 (a link dropping reports,
  # a report's timeout due), merge 11 (a report on its way) and, the newest checkpoint (13) being damaged,
  # merge 12 (learner 0's program in flight and failing: its crash due at 27.8 s, merge 12 at 27.6 s).
  for merge, resumes_from in ((6, 5), (10, 9), (12, 11), (14, 12)):
    with monkeypatch.context() as patch:
      _kill_at(patch, merge)
      with pytest.raises(_Killed):
        modes.train(faulty, tmp_path / "killed")
    if resumes_from < merge - 1:
      _damage(tmp_path / "killed" / "decoupled" / "checkpoints" / str(merge - 1))
    meta = _newest_sound_meta(tmp_path / "killed")
    assert meta["merges_done"] == resumes_from
    for m, learner in enumerate(meta["learners"]):  # a failing program surfaces at dispatch or when copied
      if f"learner{m}" in meta["failed"] or (learner["inflight"] or {}).get("failure"):
        saw.add(f"failing:learner{m}")
      saw.add(learner["status"])
    saw.update(event["kind"] for _, _, event in meta["clock"]["timeline"]["entries"])
    saw.update(f"link:{mode}" for _, _, mode in meta["links"]["faults"])
  assert {"failing:learner0", "down", "training", "report_arrived", "slice_repaired", "rejoin", "link:drop"} <= saw, saw
  result = modes.train(faulty, tmp_path / "killed")[0]
  assert _metrics(tmp_path / "killed") == _metrics(tmp_path / "reference")
  for a, b in zip(jax.tree.leaves(reference.params), jax.tree.leaves(result.params), strict=True):
    np.testing.assert_array_equal(a, b)
  assert result.final_eval_loss == reference.final_eval_loss and result.tokens == reference.tokens
  assert_ranges_tile(result, learners=range(3))
  assert reference.extras["faults"] == result.extras["faults"] == 6  # the straggler's start and end count
  # Run again, the finished run resumes from its final checkpoint and changes nothing.
  again = modes.train(faulty, tmp_path / "killed")[0]
  assert _metrics(tmp_path / "killed") == _metrics(tmp_path / "reference")
  assert again.final_eval_loss == result.final_eval_loss and not (tmp_path / "killed" / "decoupled.2").exists()


def _damage(step_dir: pathlib.Path) -> None:
  """Truncates the checkpoint's biggest file."""
  victim = max((p for p in step_dir.rglob("*") if p.is_file() and p.name != DIGEST), key=lambda p: p.stat().st_size)
  victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])


def _newest_sound_meta(workdir: pathlib.Path) -> dict:
  checkpoints = Checkpoints(workdir / "decoupled" / "checkpoints")
  step = next(s for s in checkpoints.steps() if checkpoints.problem(s) is None)
  return json.loads((checkpoints.directory / str(step) / "meta" / "metadata").read_text())


# Fault-free, so that every program is in the persistent compilation cache (fault injection's are not): quick.
DECOUPLED = ["--config=smoke", *FAST, "--config.learners=3", "--config.num_devices=3", "--config.data.batch_size=12",
             "--config.total_steps=40", "--config.overlap_steps=1", "--config.outer.quorum=2",
             "--config.clock.latency_s=0.3", "--config.checkpoint_every=2"]
WITH_FAULTS = ["--config.num_devices=4", "--config.slices=4", "--config.faults.repair_seconds=6",
               "--config.faults.report_timeout_seconds=3", f"--config.faults.schedule={FAULTS}"]


def _final_theta(workdir: pathlib.Path) -> tuple[list, dict]:
  """The final checkpoint's arrays (Θ among them) and its metadata."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from runtime.checkpoint.store import restore_args  # pylint: disable=g-import-not-at-top
  directory = _run_dir(workdir) / "checkpoints"
  step = max(int(p.name) for p in directory.iterdir() if p.name.isdigit())
  meta = json.loads((directory / str(step) / "meta" / "metadata").read_text())
  assert meta["finished"]
  target = {k: np.empty(shape, dtype) for k, (shape, dtype) in meta["arrays"].items()}
  with ocp.CheckpointManager(directory, item_names=("state",)) as manager:
    state = manager.restore(step, args=ocp.args.Composite(state=restore_args(target))).state
  return [state[k] for k in meta["syncer"]["params"]["keys"]], meta


def _assert_tiles(meta: dict) -> None:
  for m in range(3):
    ranges = sorted((a, b) for l, a, b in meta["log"]["merged_ranges"] if l == m)
    assert ranges and ranges[0][0] == 0 and all(e == s for (_, e), (s, _) in zip(ranges, ranges[1:])), ranges


@pytest.mark.slow  # CI time (~95 s cold: three launches); the twenty SIGKILLs below are slow too
def test_a_sigkilled_decoupled_run_resumes_and_ends_bit_identical(tmp_path):
  reference = launch("train", *DECOUPLED, f"--workdir={tmp_path / 'reference'}", cwd=tmp_path)
  assert reference.returncode == 0, reference.stderr[-3000:]
  workdir = tmp_path / "killed"
  _kill_after_first_checkpoint(DECOUPLED, workdir, tmp_path)
  assert len(_metrics(workdir).splitlines()) < len(_metrics(tmp_path / "reference").splitlines())  # killed mid-run
  out = launch("train", *DECOUPLED, f"--workdir={workdir}", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed from" in out.stderr
  assert _metrics(workdir) == _metrics(tmp_path / "reference")
  (theta, meta), (theta_ref, _) = _final_theta(workdir), _final_theta(tmp_path / "reference")
  for a, b in zip(theta, theta_ref, strict=True):
    np.testing.assert_array_equal(a, b)
  _assert_tiles(meta)


@pytest.mark.slow
def test_twenty_random_sigkills_across_seeds_lose_nothing_and_repeat_nothing(tmp_path):
  rng, kills, mid_save, runs = random.Random(1), 0, 0, 0
  for seed in (0, 1):
    args = [*DECOUPLED, *WITH_FAULTS, f"--config.seed={seed}", "--config.total_steps=80"]
    root = tmp_path / f"seed{seed}"
    root.mkdir()
    start = time.monotonic()
    assert launch("train", *args, f"--workdir={root / 'reference'}", cwd=root).returncode == 0
    lasts = time.monotonic() - start  # kills land anywhere from start-up to the last merges
    while kills < 10 * (seed + 1):
      workdir, runs = root / f"killed{runs}", runs + 1  # a fresh run each time: a finished one cannot be killed
      done, during_save = _killed_then_resumed(args, workdir, 10 * (seed + 1) - kills, rng, (0.2 * lasts, lasts))
      kills, mid_save = kills + done, mid_save + during_save
      assert _metrics(workdir) == _metrics(root / "reference")
      (theta, meta), (theta_ref, _) = _final_theta(workdir), _final_theta(root / "reference")
      assert all(np.array_equal(a, b) for a, b in zip(theta, theta_ref, strict=True))
      _assert_tiles(meta)
  print(f"{kills} kills, {mid_save} of them with a save unfinished")
  assert kills >= 20


@pytest.mark.parametrize("rule", ["momentum_per_round", "delayed_nesterov"])
def test_an_outer_rules_state_resumes_bit_identical_and_moves_with_one_learner_merges(tiny_config, tmp_path,
                                                                                     monkeypatch, rule):
  tiny_config.outer.rule = rule  # its state (a per-merge momentum, or a round's buffer and fill) is saved with Θ
  tiny_config.clock.speeds = (1.0, 1.1, 1.2, 1.3)  # merges of one learner: a quarter of a round each
  tiny_config.checkpoint_every = 1
  result = assert_resumes_bit_identical(tiny_config, tmp_path, monkeypatch, kills=(3,))
  merges = [r for r in result.records if r["kind"] == "merge"]
  assert {r["num_merged"] for r in merges} == {1}
  tiny_config.outer.rule = "nesterov"
  other = modes.train(tiny_config, tmp_path / "nesterov")[0]
  assert other.final_eval_loss != result.final_eval_loss



def _queued_matrix():
  """parts_in_flight × overlap_steps × outer.keep_training (it needs overlap) × jitter; three cases with two parts in
  flight in the default suite, the other nine under -m slow (CI time: ~10 s a case)."""
  for in_flight in (1, 2):
    for overlap in (0, 2):
      for keep in (False, True)[:1 + (overlap > 0)]:
        for jitter in (0.0, 0.1):
          slow = (in_flight, overlap, keep, jitter) not in ((2, 2, False, 0.0), (2, 2, True, 0.1), (2, 0, False, 0.1))
          yield pytest.param(in_flight, overlap, keep, jitter, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("in_flight,overlap,keep_training,jitter", _queued_matrix())
def test_parts_queued_behind_each_other_resume_bit_identical(tiny_config, tmp_path, monkeypatch, in_flight, overlap,
                                                            keep_training, jitter):
  """A part queued behind another keeps the modeled time it waits across a resume (it was lost: the resumed run's
  merges came earlier and its busy fractions went above 1)."""
  tiny_config.clock.speeds = (1.0, 1.1, 1.2, 1.3)  # parts queue behind each other at different modeled times
  tiny_config.total_steps = 40
  tiny_config.parts_in_flight, tiny_config.overlap_steps = in_flight, overlap
  tiny_config.outer.keep_training, tiny_config.clock.jitter = keep_training, jitter
  tiny_config.checkpoint_every = 1
  assert_resumes_bit_identical(tiny_config, tmp_path, monkeypatch, kills=(3,))


def test_checkpoints_by_the_hosts_clock_alone_resume_bit_identical(tiny_config, tmp_path, monkeypatch):
  """checkpoint_wall_seconds (on by default) alone: due by the host's seconds, whatever the run's clock, and a run
  resumed from them is the run never killed."""
  tiny_config.checkpoint_wall_seconds = 1e-6  # (every merge)
  assert_resumes_bit_identical(tiny_config, tmp_path, monkeypatch, kills=(3,))
  assert (tmp_path / "killed" / "decoupled" / "checkpoints").is_dir()
