"""Learners in Ray actors under the real clock (backend "ray", runtime/diloco/learner/ray_learner.py): a learner's
process that dies (killed by the injector or from outside, one process of a gang or the only one), hangs, or stops
answering is a removed future: the learner crashes once, a new actor (or gang) takes its place and it rejoins, and
the run trains its budget with no token merged twice. (Under the virtual clock, the equality with in-process runs:
test_ray_backend.py.)"""

import math
import os
import re
import signal
import threading
import time

import pytest

from invariants import assert_data_accounted
from runtime.diloco.controller import Controller
from runtime.experiments import modes
from runtime.train.harness import Experiment
from test_ray_backend import _records, _smoke, cluster  # pylint: disable=unused-import  (the module's cluster)

ray = pytest.importorskip("ray")


def test_under_the_real_clock_learners_in_actors_train_to_the_budget_through_a_crash(cluster, tmp_path):
  # A part's future is the actor's part_done; the crash is armed at an inner step, raised in the actor's program.
  del cluster
  config = _smoke("ray", "crash:learner=1,step=24,repair=0.5")
  config.clock.kind = "real"
  result = modes.train(config, tmp_path)[0]
  records = _records(tmp_path / "decoupled")
  assert result.tokens == config.total_steps * config.data.batch_size * config.data.seq_len
  crashes = [r["detail"] for r in records if r.get("fault") == "crash"]
  assert len(crashes) == 1 and "SliceCrash: injected crash of learner 1's slice at inner step 24" in crashes[0]
  assert [r["learner"] for r in records if r.get("fault") == "rejoin"] == [1]  # after its 0.5 s (not the 60 s default)
  assert result.extras["merges"] >= 6 and result.final_eval_loss < 4.0  # (uniform over bytes: 5.5)


def test_under_the_real_clock_learners_of_lent_capacity_join_in_the_actors_that_compiled_for_their_slices(
    cluster, tmp_path):
  # Two slices lent at t=0.3 for 1.5 s (of a run of ~4 s): each learner of lent capacity has an actor holding both
  # lent slices, compiled for each at start-up; a lent slice's learner joins there (no new process) and leaves, its
  # leases given back (how much it trains in 1.5 s depends on the host's load: merged lent work is asserted under the
  # virtual clock, test_ray_backend.py).
  del cluster
  config = _smoke("ray")
  config.clock.kind, config.num_devices, config.data.assignment = "real", 8, "service"
  config.capacity.schedule, config.total_steps = "lend:slices=2,time=0.3,duration=1.5", 120
  run = modes.prepare(config)
  controller = Controller(run, Experiment(run), tmp_path, "decoupled")
  pids = [learner.pids for learner in controller.learners]
  result = controller.train()
  records = _records(tmp_path / "decoupled")
  faults = sorted((r["fault"], r["learner"]) for r in records if r["kind"] == "fault")
  assert faults == [("join", 2), ("join", 3), ("leave", 2), ("leave", 3)], faults
  assert [learner.pids for learner in controller.learners] == pids  # (no actor replaced)
  assert result.tokens == run.token_budget
  assert_data_accounted(result, seq_len=run.data.seq_len)


def _killed_run(tmp_path, schedule: str, kill_at_step: int | None = None, hang_seconds: float = 120.0,
                processes: int = 1, member: int = 0, how: signal.Signals = signal.SIGKILL, hang_factor: float = 10.0,
                fragments: int = 1, slices_per_learner: int = 1, assignment: str = "shards"):
  """A real-clock run whose learner 1 loses a process: by the injector (`schedule`), or its gang's `member` sent
  `how` (SIGKILL; SIGSTOP: it neither answers nor dies) from outside once it has trained `kill_at_step` inner steps.
  Its controller, result, records and learner 1's first process ids."""
  config = _smoke("ray", schedule, processes=processes)
  config.clock.kind, config.ray.hang_seconds, config.ray.hang_factor = "real", hang_seconds, hang_factor
  config.fragments, config.slices_per_learner, config.data.assignment = fragments, slices_per_learner, assignment
  if kill_at_step is not None:
    config.faults.repair_seconds = 0.5  # (the injector's crash gives its own)
  run = modes.prepare(config)
  controller = Controller(run, Experiment(run), tmp_path, "decoupled")
  learner = controller.learners[1]
  first = learner.pids
  if kill_at_step is not None:
    def kill():  # (the book this side keeps grows with each answer of the actor)
      while learner.total_steps < kill_at_step:
        time.sleep(0.005)
      os.kill(first[member], how)
    threading.Thread(target=kill, daemon=True).start()
  result = controller.train()
  return controller, result, _records(tmp_path / "decoupled"), first, run


def _assert_replaced(controller, result, records, first, run, why: str = "process ended", rejoins: bool = True):
  """Learner 1 crashed once with its process and has new actors (every process of its gang new), on which it rejoined
  and trained (if `rejoins`: a hang found late may leave it nothing to train); every token merged once."""
  crashes = [r for r in records if r.get("fault") == "crash"]
  assert [r["learner"] for r in crashes] == [1] and why in crashes[0]["detail"], crashes
  learner = controller.learners[1]
  assert len(learner.pids) == len(first) and not set(learner.pids) & set(first)  # new processes
  if rejoins:
    rejoin = next(r for r in records if r.get("fault") == "rejoin")
    assert rejoin["learner"] == 1 and rejoin["time"] > crashes[0]["time"]
    assert any(at > rejoin["time"] for at, _ in learner.completions)  # which trained
  assert result.tokens == run.token_budget  # the budget merged (tokens written off were trained again) ...
  for m in range(2):  # ... and no batch of a learner's data twice
    ranges = sorted((a, b) for who, a, b in controller.log.merged_ranges if who == m)
    assert all(b <= a for (_, b), (a, _) in zip(ranges, ranges[1:])), ranges
  if run.data.assignment == "service":  # (its new actor took the leases the controller holds for it)
    assert_data_accounted(result, seq_len=run.data.seq_len)
  assert result.final_eval_loss < 4.0


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.slow)], ids=["actor", "gang"])
def test_a_learner_whose_process_the_injector_kills_mid_round_rejoins_on_a_new_actor(cluster, tmp_path, processes):
  # ends=process: at inner step 24 the actor's own step check SIGKILLs its process (no error is raised anywhere; in
  # a gang, each member's check ends its own)
  del cluster
  _assert_replaced(*_killed_run(tmp_path, "crash:learner=1,step=24,ends=process,repair=0.5", processes=processes))


@pytest.mark.parametrize("fragments, assignment", [(1, "service"), (2, "shards")], ids=["data_service", "fragments"])
def test_a_learner_whose_process_is_killed_from_outside_rejoins_on_a_new_actor(cluster, tmp_path, fragments,
                                                                               assignment):
  # (with fragments its new actor compiles for Θ whole, not for the last fragment's tensors put for a delivery; with
  # the data service it starts from the leases the controller kept for it, and rewinds onto them)
  del cluster
  _assert_replaced(*_killed_run(tmp_path, "", kill_at_step=20, fragments=fragments, assignment=assignment))


def test_a_learner_whose_process_is_killed_before_the_run_starts_rejoins_on_a_new_actor(cluster, tmp_path):
  del cluster  # (found by its warm-up or its first reset: it crashes as the run starts)
  controller, result, records, first, run = _killed_run(tmp_path, "", kill_at_step=0)
  _assert_replaced(controller, result, records, first, run)
  assert next(r for r in records if r.get("fault") == "crash")["time"] < 1.0


@pytest.mark.slow  # ~55 s (CI time); the suite keeps a call's deadline (below) and the hang's refusal
def test_a_hung_learner_is_killed_at_its_deadline_and_rejoins_on_a_new_actor(cluster, tmp_path):
  # ends=hang: at inner step 24 the actor's step check stops for good; nothing answers, nothing dies, until the
  # part's (or a call's) deadline of ~5 s kills the process
  del cluster
  killed = _killed_run(tmp_path, "crash:learner=1,step=24,ends=hang,repair=0.5", hang_seconds=5.0)
  _assert_replaced(*killed, why="learner 1's process ended: hung: ", rejoins=False)
  crash = next(r for r in killed[2] if r.get("fault") == "crash")
  last = max(at for at, _ in killed[0].learners[1].completions if at < crash["time"])  # (its hung part came after)
  # at its deadline: 5 s + 10 x its steps (and those queued ahead) at its measured step time, as the record names it
  deadline = float(re.search(r"hung: .* in ([0-9.]+) s", crash["detail"]).group(1))
  assert 5.0 <= deadline and 5.0 <= crash["time"] <= last + deadline + 5.0, (crash, last)


def test_a_learner_whose_process_stops_answering_is_killed_at_its_call_deadline(cluster, tmp_path):
  # SIGSTOPped from outside at step 20: a call to it (a merge's Θ, a read of its book) is not answered in 5 s and
  # its process is killed (a part's deadline, 5 s + 1000 x its steps' time, would come far later)
  del cluster
  killed = _killed_run(tmp_path, "", kill_at_step=20, hang_seconds=5.0, how=signal.SIGSTOP, hang_factor=1000.0)
  _assert_replaced(*killed, why="learner 1's process ended: hung: no answer to ", rejoins=False)
  crash = next(r for r in killed[2] if r.get("fault") == "crash")
  last = max(at for at, _ in killed[0].learners[1].completions if at < crash["time"])  # (the call came after)
  assert last + 5.0 - 0.5 <= crash["time"] <= last + 5.0 + 5.0 and "in 5 s" in crash["detail"], crash


@pytest.mark.parametrize("member", [1, pytest.param(0, marks=pytest.mark.slow)], ids=["second", "coordinator"])
def test_a_learner_of_two_processes_is_replaced_as_a_unit_when_one_is_killed(cluster, tmp_path, member):
  # One process of learner 1's gang SIGKILLed from outside mid-round: the other cannot go on alone (its programs
  # need both); the learner crashes once, both are ended and a new gang of two takes its place, and it rejoins
  del cluster
  killed = _killed_run(tmp_path, "", kill_at_step=20, processes=2, member=member)
  _assert_replaced(*killed)
  assert killed[0].learners[1].processes == 2


@pytest.mark.slow  # ~30 s
def test_a_learner_of_two_slices_whose_process_is_killed_rejoins_on_both(cluster, tmp_path):
  # its new actor holds both slices' devices again: it rejoins on its first and grows back onto the second (in the
  # smoke budget's ~7 s it may not train again there: its one-slice programs compile first)
  del cluster
  killed = _killed_run(tmp_path, "", kill_at_step=20, slices_per_learner=2)
  _assert_replaced(*killed, rejoins=False)
  moves = [(r["fault"], r["detail"]) for r in killed[2] if r.get("learner") == 1 and r["kind"] == "fault"]
  assert moves[1:] == [("rejoin", "on slices [2]"), ("expand", "onto slices [2, 3] of 2")], moves


@pytest.mark.slow  # ~30 s
def test_under_the_real_clock_a_learner_of_two_slices_grows_onto_a_spare_in_a_new_actor(cluster, tmp_path):
  # learner 1's slice 3 crashes at t=2 (repaired after 60 s, past the run): it shrinks onto slice 2, and the spare
  # (slice 4) reaches it; its old actor packs its state, a new one made for slices 2 and 4 takes it over
  del cluster
  config = _smoke("ray", "crash:learner=1,time=2,slice=1,repair=60")
  config.clock.kind, config.slices_per_learner, config.num_devices, config.slices = "real", 2, 5, 5
  config.faults.spare_swap_seconds, config.faults.reconfig_seconds = 0.1, 0.3  # (the spare comes mid-reconfiguration)
  config.total_steps *= 2  # (time to train after the move: its new actor compiles first)
  run = modes.prepare(config)
  controller = Controller(run, Experiment(run), tmp_path, "decoupled")
  first = controller.learners[1].pids
  result = controller.train()
  records = _records(tmp_path / "decoupled")
  moves = [(r["fault"], r["detail"]) for r in records if r.get("learner") == 1 and r["kind"] == "fault"]
  assert [f for f, _ in moves] == ["shrink", "expand"] and "[2, 4]" in moves[1][1], moves
  expanded = next(r["time"] for r in records if r.get("fault") == "expand")
  learner = controller.learners[1]
  assert not set(learner.pids) & set(first) and learner.slices == (2, 4)  # a new process, on the spare
  assert any(at > expanded for at, _ in learner.completions)  # which trained there
  assert result.tokens == run.token_budget
  for m in range(2):  # no batch of a learner's data twice
    ranges = sorted((a, b) for who, a, b in controller.log.merged_ranges if who == m)
    assert all(b <= a for (_, b), (a, _) in zip(ranges, ranges[1:])), ranges


def test_a_learner_whose_process_is_found_ended_as_the_run_finishes_still_has_the_final_checkpoint_saved(
    cluster, tmp_path):
  # Learner 1's process SIGKILLed once the budget is merged, as the run marks its learners done: its death is found
  # there (not by a merge's checkpoint), it crashes as in the run, and the final checkpoint is saved with its book
  # (its new actor answers for it); a rerun resumes from that checkpoint and only reports
  del cluster
  config = _smoke("ray")
  config.checkpoint_every = 100  # (none before the end: the final one, due at the finish, is the one kept)
  run = modes.prepare(config)
  controller = Controller(run, Experiment(run), tmp_path, "decoupled")
  learner, first = controller.learners[1], controller.learners[1].pids
  finish = controller.slices.settle  # (the run's end: after its loop, once every learner has finished)
  controller.slices.settle = lambda: os.kill(first[0], signal.SIGKILL) or time.sleep(0.5) or finish()
  result = controller.train()
  assert learner.pids != first and result.tokens == run.token_budget
  assert [(r["fault"], r["learner"]) for r in _records(tmp_path / "decoupled") if r["kind"] == "fault"] == [
      ("crash", 1)]
  assert controller.durability.finished and [final for _, _, final in controller.durability.saves] == [True]
  records = _records(tmp_path / "decoupled")
  again = Controller(run, Experiment(run), tmp_path, "decoupled").train()  # (resumed from the final checkpoint)
  assert again.final_eval_loss == result.final_eval_loss and _records(tmp_path / "decoupled") == records


def test_a_move_of_the_book_noted_while_a_new_actor_starts_stays_when_that_actor_is_found_ended_too(cluster,
                                                                                                    tmp_path):
  # Learner 1's process SIGKILLed before the run, found and failed: a new actor starts from its book (down). "Done"
  # is noted (made on the book here at once, carried by its next call); that call takes the new actor's first answer
  # (its book as revived: down) and finds the new process killed too. The learner stays done, as noted (the moves
  # noted since the revive are made again on the answer), not rolled back to down and revived from there
  del cluster
  run = modes.prepare(_smoke("ray"))
  controller = Controller(run, Experiment(run), tmp_path, "decoupled")
  learner = controller.learners[1]
  os.kill(learner.pids[0], signal.SIGKILL)
  time.sleep(0.5)
  assert math.isnan(learner.device_idle()) and learner.process_lost() is not None  # (found, answered from its book)
  learner.fail(0.0)  # (its crash, as the controller makes it: SliceLifecycle.crash_lost)
  assert learner.status == "down" and learner.process_lost() is None
  revived = ray.get(learner._starting[0])  # pylint: disable=protected-access  (the new actor's first answer)
  os.kill(revived[1]["pid"], signal.SIGKILL)
  time.sleep(0.5)
  learner.finish(1.0)
  assert learner.status == "done"
  assert math.isnan(learner.device_idle()) and learner.process_lost() is not None
  assert learner.status == "done" and learner.intervals[-1][2:] == (1.0, "down")
