"""A learner on its own slice: rounds, reports, adopting Θ, failing and rejoining."""

import dataclasses
import json

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime.checkpoint import snapshot as snapshot_lib
from runtime.cluster import devices as devices_lib
from runtime.experiments import modes
from runtime.diloco.learner.learner import Learner
from runtime.diloco.learner.lifecycle import DOWN, TRAINING, WAITING
from runtime.diloco.sync import messages
from runtime.diloco.sync.messages import Delivery
from runtime.train import tree_transfer
from runtime.train.harness import Experiment
from test_learner_book import KEYS_BEFORE_THE_BOOK


@pytest.fixture
def setup(tiny_config):
  """A learner whose reports stay on its slice (the copy route: the merge worker copies them to the host)."""
  yield from _setup(tiny_config, "copy")


@pytest.fixture
def pinned(tiny_config):
  """A learner whose reports go to its device's pinned host memory as they are taken (an accelerator's default)."""
  yield from _setup(tiny_config, "pinned")


def _setup(tiny_config, host_transfers):
  tiny_config.learners = 1
  tiny_config.num_devices = 1
  tiny_config.host_transfers = host_transfers
  run = modes.prepare(tiny_config)
  exp = Experiment(run)
  devices = jax.devices()[:1]
  learner = Learner(0, 0, devices, run, exp.shard(0, 1, run.data.batch_size))
  host = NamedSharding(devices_lib.slice_mesh([devices_lib.host_device()]), P())
  theta = jax.device_get(lm.init_params(run.model, jax.random.key(0)))
  learner.reset(theta, 0, 0.0)
  yield run, learner, host, theta, devices
  learner.close()


def _trees_equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))


def _part(learner, kind, steps, now):
  learner.dispatch(kind, steps, now, float(steps))
  return learner.collect(now + steps)


def test_a_round_books_its_tokens_steps_and_data_range_in_its_report(setup):
  run, learner, host, _, _ = setup
  assert learner.status == WAITING and learner.round == 1
  learner.dispatch("main", 3, 0.0, 3.0)
  assert learner.status == TRAINING
  learner.collect(3.0)
  report = learner.report(3.0)
  assert (report.tokens, report.steps, report.base_version, report.round) == (3 * 16 * 32, 3, 0, 1)
  assert (report.data_start["position"], report.data_end["position"]) == (0, 3)
  assert report.busy_seconds == 3.0 and np.isfinite(report.loss)
  assert learner.completions == [(3.0, 3)] and learner.total_steps == 3


def _receiving(learner, receive):
  learner.run = dataclasses.replace(learner.run, overlap_steps=1,
                                    outer=dataclasses.replace(learner.run.outer, receive=receive))


def test_adopting_theta_by_overwrite_serves_the_overlap_steps_data_again(setup):
  _, learner, host, theta, _ = setup
  _receiving(learner, "overwrite")
  _part(learner, "main", 3, 0.0)
  learner.report_sent(learner.report(3.0))
  _part(learner, "overlap", 1, 3.0)
  assert learner.deliver(Delivery(1, theta, round=1))
  written_off = learner.adopt(4.0)
  assert written_off == 1 * 16 * 32  # the overlap step, trained but never reported
  _trees_equal(learner.state.params, theta)
  _part(learner, "main", 3, 4.0)
  report = learner.report(7.0)
  assert (report.data_start["position"], report.base_version, report.round) == (3, 1, 2)


def test_adopting_theta_carries_the_overlap_progress_onto_it_and_into_the_next_report(setup):
  # Regression: overlap steps were thrown away (overwrite) and their data trained again.
  _, learner, host, theta, _ = setup
  _receiving(learner, "carry")
  _part(learner, "main", 3, 0.0)
  sent = learner.report(3.0)
  learner.report_sent(sent)
  _part(learner, "overlap", 1, 3.0)
  progress = jax.tree.map(np.subtract, jax.device_get(learner.state.params), jax.device_get(sent.params))
  theta_new = jax.tree.map(lambda x: x + 0.5, theta)
  assert learner.deliver(Delivery(1, theta_new, round=1))
  assert learner.adopt(4.0) == 0  # nothing written off
  jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, atol=1e-6),
               jax.device_get(learner.state.params), jax.tree.map(np.add, theta_new, progress))
  assert learner.tokens == 16 * 32  # the overlap step opens the new round
  _part(learner, "main", 3, 4.0)
  report = learner.report(7.0)
  assert (report.data_start["position"], report.data_end["position"]) == (3, 7)  # the overlap step's batch too
  assert (report.tokens, report.steps, report.busy_seconds) == (4 * 16 * 32, 4, 4.0)


def test_a_delivery_for_an_earlier_round_or_a_down_learner_is_ignored(setup):
  _, learner, _, theta, _ = setup
  assert not learner.deliver(Delivery(1, theta, round=0))
  learner.fail(0.0)
  assert not learner.deliver(Delivery(1, theta, round=1))


def test_reset_starts_fresh_inner_state_at_the_learners_own_step(setup):
  _, learner, _, theta, _ = setup
  _part(learner, "main", 3, 0.0)
  learner.reset(theta, 2, 3.0)
  assert int(learner.state.step) == 3  # the inner learning-rate schedule continues, the moments restart
  adam = learner.state.opt_state[1][0]
  assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(adam.mu))
  # Regression: the schedule's own count restarted at 0, so a rejoiner warmed up and decayed again.
  assert int(adam.count) == 0  # fresh moments: fresh bias correction
  schedule = learner.state.opt_state[1][-1]
  assert isinstance(schedule, optax.ScaleByScheduleState) and int(schedule.count) == 3


def test_failing_drops_the_round_in_flight_and_rejoining_resumes_after_the_last_report(setup):
  _, learner, host, theta, devices = setup
  _part(learner, "main", 3, 0.0)
  sent = learner.report(3.0)
  learner.report_sent(sent)
  learner.dispatch("overlap", 2, 3.0, 2.0)
  failure = learner.fail(4.0)
  assert (failure.slice_index, failure.unmerged_tokens) == (0, 2 * 16 * 32)
  assert failure.lost_seconds == 0.0  # its round's main part was reported
  assert learner.status == DOWN and learner.slice_index == -1 and learner.inflight is None
  learner.report_settled(sent, merged=True)
  learner.rejoin(0, devices, theta, 7, 9.0)
  assert learner.status == WAITING and learner.slice_index == 0 and learner.base_version == 7
  _part(learner, "main", 3, 9.0)
  assert learner.report(12.0).data_start["position"] == 3


def test_a_report_taken_with_a_part_queued_behind_it_ends_its_data_where_its_work_does(setup):
  """Two parts in flight: the overlap part is dispatched before the main part's report is taken; the report's data
  ends with the main part, so a failure writing off the overlap work serves that data again."""
  _, learner, host, theta, devices = setup
  learner.dispatch("main", 3, 0.0, 3.0)
  learner.dispatch("overlap", 2, 0.5, 2.0)  # queued behind the main part
  learner.collect(3.0)
  sent = learner.report(3.0)
  assert (sent.data_start["position"], sent.data_end["position"], sent.tokens) == (0, 3, 3 * 16 * 32)
  learner.report_sent(sent)
  assert learner.fail(4.0).unmerged_tokens == 2 * 16 * 32
  learner.report_settled(sent, merged=True)
  learner.rejoin(0, devices, theta, 1, 5.0)
  _part(learner, "main", 3, 5.0)
  assert learner.report(8.0).data_start["position"] == 3  # the overlap part's data (3, 5) is served again


def test_a_quarantined_reports_data_is_trained_again(setup):
  _, learner, host, theta, _ = setup
  _part(learner, "main", 3, 0.0)
  report = learner.report(3.0)
  learner.report_sent(report)
  learner.report_settled(report, merged=False)
  assert learner.reports_out == 0
  learner.deliver(Delivery(0, theta, round=1, reset=True, rewind_to=report.data_start))
  assert learner.adopt(3.0) == 0  # nothing beyond the report was trained
  _part(learner, "main", 3, 3.0)
  assert learner.report(6.0).data_start["position"] == 0


def test_mixing_never_mixes_in_work_whose_data_is_trained_again(setup):
  # Regression (review): a report lost on its link rewinds its data, yet "mix" still mixed its work into θ.
  _, learner, host, theta, _ = setup
  _receiving(learner, "mix")
  _part(learner, "main", 3, 0.0)
  report = learner.report(3.0)
  assert learner.deliver(Delivery(0, theta, round=1, rewind_to=report.data_start))
  learner.adopt(3.0)
  _trees_equal(learner.state.params, theta)


def test_a_snapshot_restores_into_a_fresh_learner_its_book_state_and_part_in_flight(setup):
  run, learner, host, theta, devices = setup
  _part(learner, "main", 3, 0.0)
  learner.report_sent(learner.report(3.0))
  learner.dispatch("overlap", 1, 3.0, 1.0)
  treedefs = dict(params=jax.tree.structure(theta), train=jax.tree.structure(learner.state))
  packer = snapshot_lib.Packer((), treedefs, messages.CODECS)
  saved = json.loads(json.dumps(learner.snapshot(packer)))  # (as the controller's checkpoint copies it)
  device_keys = {"fragments", "slice_index", "slices", "data", "before", "leases", "state", "inbox", "at_report",
                 "inflight", "uplink", "downlink", "queued", "void", "device", "captured", "state_saved"}
  assert set(saved) == KEYS_BEFORE_THE_BOOK | device_keys  # checkpoints written before the book load
  unpacker = snapshot_lib.Unpacker(*snapshot_lib.fetch(packer.groups), (), treedefs, host, messages.CODECS)
  fresh = Learner(0, 0, devices, run, Experiment(run).shard(0, 1, run.data.batch_size))
  try:
    fresh.restore(saved, unpacker, theta)
    assert json.dumps(fresh.book.snapshot()) == json.dumps(learner.book.snapshot())
    assert (fresh.collect(4.0).steps, fresh.book.tokens) == (1, 4 * 16 * 32)
    learner.collect(4.0)
    _trees_equal(fresh.state.params, learner.state.params)
    assert json.dumps(fresh.book.snapshot()) == json.dumps(learner.book.snapshot())  # (NaN too)
    assert fresh.device == learner.device and fresh.device.parts == 2
  finally:
    fresh.close()


def test_a_main_part_copies_its_report_itself_so_the_part_behind_it_may_donate_the_state(setup, monkeypatch):
  """No copy program is enqueued for a whole report: the main part returns the copy, in its own buffers."""
  from runtime.diloco.learner import report_capture  # pylint: disable=g-import-not-at-top
  copies = []
  monkeypatch.setattr(report_capture.tree_transfer, "fresh_copy", lambda t: copies.append(t) or jax.tree.map(
      lambda x: x.copy(), t))
  _, learner, _, _, _ = setup
  learner.run = dataclasses.replace(learner.run, overlap_steps=1)
  learner.dispatch("main", 2, 0.0, 2.0)
  final = _on_device_copy(learner.state.params)  # (a host view of the state would keep XLA:CPU from donating it)
  learner.capture_report()
  learner.dispatch("overlap", 1, 2.0, 1.0)  # donates the main part's state
  learner.collect(2.0), learner.collect(3.0)
  report = learner.report(3.0)
  assert not copies
  _trees_equal(report.params, final)
  assert not jax.tree.leaves(report.params)[0].is_deleted()


def test_a_report_taken_from_another_state_than_the_main_part_ended_in_is_copied_from_that_state(setup, monkeypatch):
  from runtime.diloco.learner import report_capture  # pylint: disable=g-import-not-at-top
  copies = []
  monkeypatch.setattr(report_capture.tree_transfer, "fresh_copy", lambda t: copies.append(t) or jax.tree.map(
      lambda x: x.copy(), t))
  _, learner, _, _, _ = setup
  learner.run = dataclasses.replace(learner.run, overlap_steps=1)
  _part(learner, "main", 2, 0.0)
  learner.state = learner.state.replace(params=jax.tree.map(lambda x: x + 1, learner.state.params))
  report = learner.report(2.0)
  assert len(copies) == 1
  _trees_equal(report.params, learner.state.params)


def _on_device_copy(tree):
  return jax.jit(lambda t: jax.tree.map(lambda x: x + 0, t))(tree)


def test_without_overlap_steps_a_report_is_the_states_own_tensors_and_the_next_round_leaves_them_intact(setup,
                                                                                                       monkeypatch):
  """τ = 0: no part runs behind the report's part before the Θ that answers it replaces the reported tensors, so the
  report copies nothing (no copy program, no copied outputs), and the next round donates Θ's buffers, not its."""
  from runtime.diloco.learner import report_capture  # pylint: disable=g-import-not-at-top
  copies = []
  monkeypatch.setattr(report_capture.tree_transfer, "fresh_copy", lambda t: copies.append(t) or t)
  _, learner, _, theta, _ = setup
  assert learner.run.overlap_steps == 0
  learner.dispatch("main", 2, 0.0, 2.0)
  final = _on_device_copy(learner.state.params)
  learner.collect(2.0)
  report = learner.report(2.0)
  assert not copies
  assert all(a is b for a, b in zip(jax.tree.leaves(report.params), jax.tree.leaves(learner.state.params)))
  learner.report_sent(report)
  assert learner.deliver(Delivery(params=theta, version=1, round=learner.round))
  learner.adopt(2.0)
  learner.dispatch("main", 2, 2.0, 2.0)  # donates the adopted Θ's buffers
  learner.collect(4.0)
  assert not any(x.is_deleted() for x in jax.tree.leaves(report.params))
  _trees_equal(report.params, final)


def test_a_learner_whose_slice_failed_keeps_no_state_so_the_final_checkpoint_never_reads_donated_buffers(setup):
  """Regression (real-clock kill soak): a program that fails at dispatch has donated the state; the learner, down at
  the run's end and then marked done, was saved from those deleted buffers (ValueError, exit 1)."""
  _, learner, _, theta, _ = setup
  _part(learner, "main", 2, 0.0)
  treedefs = dict(params=jax.tree.structure(theta), train=jax.tree.structure(learner.state))
  jax.tree.map(lambda x: x.delete(), learner.state)  # (what the failing dispatch's donation left)
  learner.fail(2.0)
  learner.finish(9.0)  # the run ended while it was down
  saved = learner.snapshot(snapshot_lib.Packer((), treedefs, messages.CODECS))
  assert learner.state is None and saved["state"] is None


@pytest.mark.parametrize("overlap_steps", [0, 1])
def test_on_the_pinned_route_a_report_is_staged_as_it_is_taken_from_the_tensors_a_copy_route_report_holds(
    pinned, monkeypatch, overlap_steps):
  """τ = 0: staged from the state's own tensors; τ = 1: from the main part's own copy (no copy program either way,
  and the part behind it may still donate the state)."""
  from runtime.diloco.learner import report_capture  # pylint: disable=g-import-not-at-top
  copies, staged, stage = [], [], tree_transfer.stage
  monkeypatch.setattr(report_capture.tree_transfer, "fresh_copy", lambda t: copies.append(t) or t)
  monkeypatch.setattr(report_capture.tree_transfer, "stage", lambda t: staged.append(t) or stage(t))
  _, learner, _, _, _ = pinned
  learner.run = dataclasses.replace(learner.run, overlap_steps=overlap_steps)
  learner.dispatch("main", 2, 0.0, 2.0)
  final = _on_device_copy(learner.state.params)
  before = jax.tree.leaves(learner.state.params)
  learner.capture_report()
  assert len(staged) == 1  # as it is taken, before the part behind it is enqueued
  if overlap_steps:  # the main part's own copy (kept for the overlap's carry too)
    assert staged[0] is learner._at_report and not set(map(id, jax.tree.leaves(staged[0]))) & set(map(id, before))
  else:  # the state's own tensors (nothing donates them before Θ replaces them)
    assert all(a is b for a, b in zip(jax.tree.leaves(staged[0]), before))
  if overlap_steps:
    learner.dispatch("overlap", 1, 2.0, 1.0)  # donates the main part's state
  learner.collect(2.0)
  if overlap_steps:
    learner.collect(3.0)
  report = learner.report(3.0)
  assert not copies and isinstance(report.params, tree_transfer.Staged)
  assert report.params.flat.sharding.memory_kind == "pinned_host"
  _trees_equal(tree_transfer.host_view(report.params), final)


def test_on_the_pinned_route_a_staged_report_taken_or_in_transit_is_checkpointed_from_its_source(pinned, monkeypatch):
  """A checkpoint saves a staged report from the tensors it was staged from (on the controller's thread nothing
  waits for the transfer) and restores it as they were."""
  waited = []
  monkeypatch.setattr(tree_transfer.Staged, "host", lambda self: waited.append(self) or 1 / 0)
  run, learner, host, theta, devices = pinned
  learner.run = dataclasses.replace(learner.run, overlap_steps=1)
  _part(learner, "main", 2, 0.0)
  learner.capture_report()  # taken and staged, not sent
  treedefs = dict(params=jax.tree.structure(theta), train=jax.tree.structure(learner.state))
  packer = snapshot_lib.Packer((), treedefs, messages.CODECS)
  saved = json.loads(json.dumps(learner.snapshot(packer)))
  report = learner.report(2.0)
  in_transit = json.loads(json.dumps(packer.value(report)))
  assert not waited
  monkeypatch.undo()
  unpacker = snapshot_lib.Unpacker(*snapshot_lib.fetch(packer.groups), (), treedefs, host, messages.CODECS)
  _trees_equal(unpacker.value(in_transit).params, tree_transfer.host_view(report.params))
  fresh = Learner(0, 0, devices, run, Experiment(run).shard(0, 1, run.data.batch_size))
  try:
    fresh.restore(saved, unpacker, theta)
    _trees_equal(tree_transfer.host_view(fresh.report(2.0).params), tree_transfer.host_view(report.params))
  finally:
    fresh.close()
