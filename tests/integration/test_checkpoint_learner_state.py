"""Checkpoints without the learners' inner state (checkpoint_learner_state=False): Θ, the outer optimizer and the
run's bookkeeping only; a resumed run restarts every learner from Θ, writes off the work it had not merged, and
still trains its budget, no window of data lost or merged twice."""

import json
import shutil

import jax
import numpy as np
import pytest

from invariants import assert_data_accounted
from runtime.experiments import modes
from test_resume import _Killed, _kill_at, _newest_sound_meta

KILLED_AT = 4  # the run dies as it is about to save the checkpoint of merge 4: it resumes from merge 3


@pytest.fixture
def stateless(tiny_config):
  """Two learners, K=1 with an overlap step (parts in flight and reports in transit at every merge), a crash before
  the checkpoint it resumes from, and the data service (so that every window is accounted for)."""
  tiny_config.learners, tiny_config.outer.quorum = 2, 1
  tiny_config.inner_steps, tiny_config.overlap_steps = 2, 1
  tiny_config.total_steps = 24
  tiny_config.clock.latency_s = 0.3
  tiny_config.data.assignment = "service"
  tiny_config.faults.schedule = "crash:learner=1,time=2,repair=1"
  tiny_config.checkpoint_every = 1
  tiny_config.checkpoint_learner_state = False
  return tiny_config


def _records(run_dir) -> list[dict]:
  return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _killed(config, workdir):
  with pytest.MonkeyPatch.context() as patch:
    _kill_at(patch, KILLED_AT)
    with pytest.raises(_Killed):
      modes.train(config, workdir)


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.slow)])  # (ray: ~1 min)
def test_a_run_resumed_without_its_learners_state_restarts_them_from_theta_and_trains_its_budget(stateless, tmp_path,
                                                                                                 backend):
  if backend == "ray":
    pytest.importorskip("ray")
  stateless.backend = backend
  whole = modes.train(stateless, tmp_path / "whole")[0]
  _killed(stateless, tmp_path / "killed")
  meta = _newest_sound_meta(tmp_path / "killed")
  assert meta["merges_done"] == KILLED_AT - 1
  # Nothing of a learner's device state is saved: its arrays are its parts' per-step losses alone
  for m, learner in enumerate(meta["learners"]):
    assert learner["state_saved"] is False, m
    assert learner["state"] is None and learner["at_report"] is None and learner["captured"] is None, m
    assert {k for k in meta["arrays"] if k.startswith(f"learner{m}")} <= {
        k for p in (learner["inflight"], *learner["queued"]) if p for k in p["metrics"]["keys"]}, m
  training = [m for m, learner in enumerate(meta["learners"]) if learner["status"] in ("training", "waiting")]
  assert training == [0, 1]
  shutil.copytree(tmp_path / "killed", tmp_path / "again")  # (to resume a second time from the same checkpoint)
  resumed = modes.train(stateless, tmp_path / "killed")[0]
  # Each learner restarts from Θ as the run resumes, at the checkpoint's time, its unmerged work written off
  faults = [r for r in _records(tmp_path / "killed" / "decoupled") if r.get("fault")]
  restarts = [f for f in faults if f["fault"] == "restart"]
  assert [f["learner"] for f in restarts] == training
  assert {f["time"] for f in restarts} == {meta["clock"]["now"]}
  rejoins = {f["learner"] for f in faults if f["fault"] == "rejoin" and f["time"] >= meta["clock"]["now"]}
  assert rejoins == set(training)
  # The budget is trained all the same, every window merged once, and the loss falls on after the restart
  assert resumed.tokens == whole.tokens
  assert_data_accounted(resumed, stateless.data.seq_len)
  evals = [r["eval_loss"] for r in _records(tmp_path / "killed" / "decoupled") if "eval_loss" in r]
  assert resumed.final_eval_loss == evals[-1] < evals[0] - 0.5
  # Resumed again from the same checkpoint: the same bits (the virtual clock's promise)
  again = modes.train(stateless, tmp_path / "again")[0]
  for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(again.params), strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend, recovery", [
    ("local", "reconfigure"), pytest.param("local", "restart", marks=pytest.mark.slow),
    pytest.param("ray", "reconfigure", marks=pytest.mark.slow)])  # (ray: the rejoin on [2, 4] is in a new actor)
def test_learners_of_several_slices_restart_on_the_slices_they_hold(stateless, tmp_path, backend, recovery):
  """Learner 1 loses one of its two slices at t=2 and trains on the other (reconfigure: a spare reaches it at t=5
  and it is moving onto it at the checkpoint) or goes down and rejoins on [2, 4] (restart); the resume restarts each
  learner on the slices it holds then."""
  if backend == "ray":
    pytest.importorskip("ray")
  stateless.backend, stateless.faults.learner_recovery = backend, recovery
  stateless.num_devices = stateless.slices = 5  # slices 0-1 learner 0's, 2-3 learner 1's, 4 a spare
  stateless.slices_per_learner = 2
  stateless.faults.schedule = "crash:learner=1,time=2,slice=1,repair=30"
  stateless.faults.spare_swap_seconds = 3.0
  _killed(stateless, tmp_path)
  meta = _newest_sound_meta(tmp_path)
  training = [m for m, learner in enumerate(meta["learners"])
              if learner["status"] in ("training", "waiting", "reconfiguring")]
  held = {m: learner["slices"] for m, learner in enumerate(meta["learners"])}
  assert training == [0, 1] and held[0] == [0, 1]
  if recovery == "reconfigure":  # (onto [2, 4]: the spare came at t=5, the move takes 8 s)
    assert meta["learners"][1]["status"] == "reconfiguring"
  resumed = modes.train(stateless, tmp_path)[0]
  faults = [r for r in _records(tmp_path / "decoupled") if r.get("fault")]
  assert [f["learner"] for f in faults if f["fault"] == "restart"] == training
  rejoins = {f["learner"]: f["detail"] for f in faults if f["fault"] == "rejoin" and f["time"] == meta["clock"]["now"]}
  assert rejoins == {0: "on slices [0, 1]", 1: "on slices [2, 4]"}, faults
  assert resumed.tokens == modes.prepare(stateless).token_budget
  assert_data_accounted(resumed, stateless.data.seq_len)


def test_under_the_real_clock_a_run_resumed_without_its_learners_state_trains_its_budget(stateless, tmp_path):
  stateless.clock.kind = "real"
  stateless.faults.schedule = ""
  _killed(stateless, tmp_path)
  meta = _newest_sound_meta(tmp_path)
  training = [m for m, learner in enumerate(meta["learners"]) if learner["status"] in ("training", "waiting")]
  resumed = modes.train(stateless, tmp_path)[0]
  restarts = [r for r in _records(tmp_path / "decoupled") if r.get("fault") == "restart"]
  assert training and [f["learner"] for f in restarts] == training
  assert resumed.tokens == modes.prepare(stateless).token_budget
  assert_data_accounted(resumed, stateless.data.seq_len)


@pytest.mark.slow  # ~25 s
def test_learners_of_lent_slices_restart_on_their_lent_slice_and_the_budget_is_trained(stateless, tmp_path):
  stateless.num_devices, stateless.rounds.length = 4, "steps"
  stateless.capacity.schedule = "lend:slices=2,time=2,duration=100"  # learners 2 and 3 on slices 2 and 3
  stateless.faults.schedule = ""
  _killed(stateless, tmp_path)
  meta = _newest_sound_meta(tmp_path)
  training = [m for m, learner in enumerate(meta["learners"]) if learner["status"] in ("training", "waiting")]
  assert {2, 3} <= set(training)
  resumed = modes.train(stateless, tmp_path)[0]
  faults = [r for r in _records(tmp_path / "decoupled") if r.get("fault")]
  assert [f["learner"] for f in faults if f["fault"] == "restart"] == training
  assert {f["detail"] for f in faults if f["fault"] == "rejoin" and f["learner"] in (2, 3)} >= {"on slice 2",
                                                                                                 "on slice 3"}
  assert {m for r in _records(tmp_path / "decoupled") if r["kind"] == "merge" and r["time"] > meta["clock"]["now"]
          for m in r["merged"]} == {0, 1, 2, 3}
  assert resumed.tokens == modes.prepare(stateless).token_budget
  assert_data_accounted(resumed, stateless.data.seq_len)
