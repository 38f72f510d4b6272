"""Two parts in flight per learner: the next part is enqueued before the current one finishes, so a learner's device
never waits for the controller, and the host's copies (a report to the host, Θ onto the slice) run in the merge
worker; nothing is lost or merged twice, and under the virtual clock the numbers are one part at a time's."""

import json
import math
import threading
import time

import jax
import numpy as np
import pytest

from invariants import assert_data_accounted, assert_ranges_tile
from runtime.cluster import devices as devices_lib
from runtime.diloco.learner import learner as learner_lib
from runtime.experiments import modes
from runtime.train import tree_transfer

DELAY_S = 0.3


def _overlapping(config, depth, keep_training=False, receive="carry"):
  config.learners = config.num_devices = 3
  config.data.batch_size = 12
  config.total_steps, config.inner_steps, config.overlap_steps = 16, 4, 2
  config.outer.quorum = 2
  config.clock.latency_s = 0.3  # Θ arrives while the overlap part runs
  config.clock.speeds = (1.0, 1.3, 1.7)
  config.parts_in_flight, config.outer.keep_training, config.outer.receive = depth, keep_training, receive
  return config


def _records(workdir):
  return [json.loads(line) for line in (workdir / "decoupled" / "metrics.jsonl").read_text().splitlines()]


def _queue_depths(monkeypatch) -> list[int]:
  """The parts in flight after each dispatch, as the runs append them."""
  depths = []
  dispatch = learner_lib.Learner.dispatch

  def recording(self, *args, **kwargs):
    part = dispatch(self, *args, **kwargs)
    depths.append(len(self.parts))
    return part

  monkeypatch.setattr(learner_lib.Learner, "dispatch", recording)
  return depths


def test_two_parts_in_flight_train_the_same_theta_as_one_at_a_time(tiny_config, tmp_path):
  """Without outer.keep_training the learner's parts and Θ's adoptions are the same, only enqueued sooner: Θ is bit
  for bit one part at a time's, and so is every record but modeled times summed in another order."""
  one = modes.train(_overlapping(tiny_config, 1), tmp_path / "one")[0]
  two = modes.train(_overlapping(tiny_config, 2), tmp_path / "two")[0]
  for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params), strict=True):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(_records(tmp_path / "one"), _records(tmp_path / "two"), strict=True):
    assert a.keys() == b.keys()
    for key in a:
      if key in ("time", "grace", "busy", "goodput"):  # (t + queued + modeled vs (t + queued) + modeled)
        np.testing.assert_allclose(a[key], b[key], rtol=1e-12)
      elif key != "wall_time":
        assert a[key] == b[key], (key, a, b)
  assert one.extras["device_idle_max"] == pytest.approx(two.extras["device_idle_max"], rel=1e-12)


@pytest.mark.parametrize("keep_training,receive", [(True, "carry"), (False, "overwrite")])
def test_the_queue_never_exceeds_two_parts_and_nothing_is_lost_or_merged_twice(tiny_config, tmp_path, monkeypatch,
                                                                              keep_training, receive):
  """keep_training: an overlap part is queued behind each overlap part until Θ comes; overwrite: Θ adopted behind a
  part in flight voids that part (its tokens are written off and its data trained again). No window the data service
  served reaches Θ twice, and every token merged is a merged window's: a report's data ends where its work does, not
  after the parts queued behind it."""
  depths = _queue_depths(monkeypatch)
  config = _overlapping(tiny_config, 2, keep_training, receive)
  config.data.assignment = "service"
  result = modes.train(config, tmp_path)[0]
  assert max(depths) == 2 and depths.count(2) > len(depths) // 4
  assert result.tokens == config.total_steps * config.data.batch_size * config.data.seq_len
  assert_ranges_tile(result, learners=range(3))
  assert_data_accounted(result, config.data.seq_len)
  merged = [m for r in _records(tmp_path) if r["kind"] == "merge" for m in r["merged"]]
  assert len(merged) == sum(1 for r in _records(tmp_path) if r["kind"] == "merge" for _ in r["losses"])


def test_a_learner_that_trains_on_while_it_waits_for_theta_stages_each_next_part_ahead(tiny_config, tmp_path,
                                                                                       monkeypatch):
  """outer.keep_training: an overlap part is followed by another until Θ comes. Each overlap part is staged on the
  stager's thread while the part before it runs; the controller stages none itself (a main part it may: when Θ
  comes after the next overlap part was staged). Staging a part that was not guessed held the controller ~30 ms
  per overlap part on 2 cores."""
  from runtime.data import staging  # pylint: disable=g-import-not-at-top
  stage, controller, staged = staging.Stager._stage, threading.get_ident(), []

  def recording(self, chunks, sharding):
    staged.append((threading.get_ident() == controller, sum(chunks)))
    return stage(self, chunks, sharding)

  monkeypatch.setattr(staging.Stager, "_stage", recording)
  config = _overlapping(tiny_config, 2, keep_training=True)
  config.total_steps, config.inner_steps = 24, 6  # main parts of 4 steps, overlap parts of 2
  result = modes.train(config, tmp_path)[0]
  assert_ranges_tile(result, learners=range(3))
  assert len(staged) > 20 and {steps for _, steps in staged} == {2, 4}
  assert not [steps for on_controller, steps in staged if on_controller and steps == 2], staged


def test_under_the_real_clock_slow_host_copies_never_idle_the_device(tiny_config, tmp_path, monkeypatch):
  """Each report's copy to the host and each Θ's copy onto a slice takes 0.3 s more: the merge worker waits for
  them, the learners keep training (their next part is in flight all along), and no device idles > 5 %."""
  config = tiny_config
  config.clock.kind = "real"
  config.learners = config.num_devices = 2
  config.model.d_model, config.model.mlp_dim = 64, 256  # parts of tens of ms: the controller is never the bottleneck
  config.data.batch_size = 16
  # Enough budget that Θ comes back many times before it is all dispatched (a merge takes 0.6 s more here).
  config.total_steps, config.inner_steps, config.overlap_steps = 384, 16, 8
  config.outer.quorum, config.outer.keep_training = 1, True
  config.outer.quarantine_factor = 1e6  # (progress carried over many overlap parts is no corrupt report)
  config.eval_every = 10_000  # (Θ evaluated at the end only: no evaluation competes for the 2 CPU cores)
  copy_to, copies, learners, host = tree_transfer.copy_to, [], {}, devices_lib.host_device()
  dispatch, dispatched = learner_lib.Learner.dispatch, {}
  make = learner_lib.Learner.__init__

  def registering(self, *args, **kwargs):
    make(self, *args, **kwargs)
    learners[self.index] = self

  def slow(tree, sharding):
    """A report's copy to the host or Θ's onto a learner's slice, wherever it is made, takes DELAY_S more."""
    held = tree.tree if isinstance(tree, tree_transfer.Shared) else tree  # (Θ packed once; a report staged:)
    held = held.flat if isinstance(held, tree_transfer.Staged) else held  # (on its device's pinned host memory)
    source = {d for x in jax.tree.leaves(held) for d in x.sharding.device_set}
    target = set(jax.tree.leaves(sharding)[0].device_set)
    ends = source | target
    owner = next((l for l in learners.values() if l.slices and (ends - {host}) <= set(l.mesh.devices.flat)), None)
    started = time.perf_counter()
    out = copy_to(tree, sharding)
    if owner is not None and host in ends and ends != {host}:  # between the host and the learner's slice
      trained = not math.isnan(owner.device.first_enqueued)
      time.sleep(DELAY_S)
      copies.append((owner.index, threading.current_thread().name, trained, bool(owner.parts),
                     time.perf_counter() - started, time.perf_counter()))
    return out

  def dispatching(self, *args, **kwargs):
    dispatched.setdefault(self.index, []).append(time.perf_counter())
    return dispatch(self, *args, **kwargs)

  monkeypatch.setattr(learner_lib.Learner, "__init__", registering)
  monkeypatch.setattr(tree_transfer, "copy_to", slow)
  monkeypatch.setattr(learner_lib.Learner, "dispatch", dispatching)
  result = modes.train(config, tmp_path)[0]
  assert result.tokens == config.total_steps * config.data.batch_size * config.data.seq_len
  training = [c for c in copies if c[2]]  # (the first Θ each learner starts from is copied before it trains)
  assert len(training) >= 6 and all(seconds >= DELAY_S for *_, seconds, _ in training)
  assert all(thread.startswith("syncer") for _, thread, *_ in training), training  # the controller never waits
  # Until the budget is all dispatched, each copy ended with its learner's next part enqueued.
  before_the_end = [c for c in training if c[-1] < dispatched[c[0]][-1]]
  assert len(before_the_end) >= 3 and all(c[3] for c in before_the_end), before_the_end
  merges = [r for r in _records(tmp_path) if r["kind"] == "merge"]
  # (learner 0's slice is the host's device here: its copies are none, and not delayed)
  assert sum(r["host_report_copy_s"] >= DELAY_S for r in merges) >= 3
  assert sum(r["host_theta_copy_s"] >= DELAY_S for r in merges) >= 3
  assert result.extras["device_idle_max"] <= 0.05, result.details["device_idle"]
  assert not math.isnan(result.extras["device_idle_mean"])


def test_with_crashes_injected_two_parts_in_flight_train_the_same_theta_as_one_at_a_time(tiny_config, tmp_path,
                                                                                        monkeypatch):
  """A crash planned for a part queued behind another falls at the same inner step and time as when that part is
  dispatched once the one ahead ends (its first step and start are where the parts ahead end), and nothing is
  queued behind a part armed to crash: Θ and the records are one part at a time's, crashes and rejoins included."""
  depths = _queue_depths(monkeypatch)
  runs = {}
  for depth in (1, 2):
    config = _overlapping(tiny_config, depth)
    config.total_steps = 24
    config.faults.schedule = "crash:learner=1,step=7,repair=0.4;crash:learner=0,step=14,repair=0.3"
    config.faults.mtbi_chip_seconds = 40 * config.faults.chips_per_slice  # a slice fails every 40 s on average
    config.faults.repair_seconds = 3.0
    depths.clear()
    runs[depth] = modes.train(config, tmp_path / str(depth))[0], max(depths)
  (one, one_depth), (two, two_depth) = runs[1], runs[2]
  assert (one_depth, two_depth) == (1, 2)
  for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params), strict=True):
    np.testing.assert_array_equal(a, b)
  records = {depth: _records(tmp_path / str(depth)) for depth in (1, 2)}
  crashes = [r for r in records[1] if r["kind"] == "fault" and r["fault"] == "crash"]
  assert len(crashes) >= 3, crashes
  for a, b in zip(records[1], records[2], strict=True):
    assert a.keys() == b.keys()
    for key in a:
      if key in ("time", "grace", "busy", "goodput", "slice_seconds_lost"):
        np.testing.assert_allclose(a[key], b[key], rtol=1e-12)
      elif key not in ("wall_time", "detail"):
        assert a[key] == b[key], (key, a, b)


def test_a_learner_reset_behind_its_parts_in_flight_counts_their_steps(tiny_config, tmp_path, monkeypatch):
  """A quarantined report's answer resets the learner from Θ behind its overlap part (void: it trained on what the
  reset replaces). The fresh state's step count stands after that part, as the book counts it once the part is
  collected: each part's first step is the book's steps plus those in flight, where a crash's step is planned."""
  checked, dispatch = [], learner_lib.Learner.dispatch

  def checking(self, *args, **kwargs):
    checked.append((int(self.state.step), self.book.total_steps + self.steps_in_flight()))
    return dispatch(self, *args, **kwargs)

  monkeypatch.setattr(learner_lib.Learner, "dispatch", checking)
  config = _overlapping(tiny_config, 2)
  config.faults.schedule = "corrupt:learner=1,time=3,how=nan;corrupt:learner=2,time=6,how=inf"
  result = modes.train(config, tmp_path)[0]
  quarantined = [m for r in _records(tmp_path) if r["kind"] == "merge" for m in r["quarantined"]]
  assert sorted(quarantined) == [1, 2], quarantined
  assert result.tokens == config.total_steps * config.data.batch_size * config.data.seq_len
  assert len(checked) > 20 and all(step == planned for step, planned in checked), checked
