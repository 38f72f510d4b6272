"""Durability on its own: each part's snapshot saved under its key at a merge's end and handed back to it on restore."""

import jax
import numpy as np

from runtime.diloco.clock import Event, EventKind, make_clock
from runtime.diloco.durability import Durability, first_layout
from runtime.experiments import modes
from runtime.faults import injection


class _Part:
  """A part whose state is a dict: what it saved, and what it was handed back."""

  def __init__(self, state: dict, **attributes):
    self.state, self.restored = state, None
    vars(self).update(attributes)

  def snapshot(self, packer) -> dict:
    del packer
    return self.state

  def restore(self, saved: dict, unpacker) -> None:
    del unpacker
    self.restored = saved


class _Syncer:
  """Θ as one array: the arrays go through the checkpoint's store, the rest through its JSON."""

  def __init__(self, version: int):
    self.version, self.params, self.restored = version, {"w": np.arange(3.0) + version}, None

  def snapshot(self, packer) -> dict:
    return dict(version=self.version, theta=packer.tree(self.params, "dict"))

  def restore(self, saved: dict, unpacker) -> None:
    self.version, self.params, self.restored = saved["version"], unpacker.tree(saved["theta"]), saved


def _parts(run, version: int):
  """Every part Durability saves, each with state of its own (different per `version`)."""
  return dict(
      syncer=_Syncer(version), learners=_Part([dict(slices=[m], steps=version + m) for m in range(run.learners)]),
      slices=_Part(dict(pool=dict(spares=[version]), crashes=dict(drawn=[version]), lent=[])),
      links=_Part(dict(bytes_up=version)),
      budget=_Part(dict(tokens_dispatched=100 * version, reports_in_transit=version, ledger=dict(useful=version))),
      membership=_Part(dict(drawn=[version])), clock=make_clock(run.clock, run.learners, run.seed),
      merges=_Part(dict(merge_state="scheduled" if version else "idle")),
      log=_Part(dict(tokens_merged=7 * version, records=version)))


def _durability(run, tmp_path, parts):
  host = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return Durability(run, tmp_path, "run", {}, host, parts["clock"], list(parts.items()))


def test_a_checkpoint_hands_every_part_its_own_saved_state_back(tiny_config, tmp_path):
  tiny_config.checkpoint_every = 2
  run = modes.prepare(tiny_config)
  saved = _parts(run, version=3)
  saved["clock"].after(4.0, Event(EventKind.LEND, payload=(0, 1, 5.0)))
  durability = _durability(run, tmp_path, saved)
  durability.merged()
  assert not durability.saves  # one merge: not due yet
  durability.merged()
  assert len(durability.saves) == 1
  durability.checkpoints.close()

  restored = _parts(run, version=0)
  again = _durability(run, tmp_path, restored)
  log = again.restore()
  assert log == saved["log"].state and again.merges_done == 2 and not again.finished
  assert restored["syncer"].version == 3 and np.array_equal(restored["syncer"].params["w"], [3.0, 4.0, 5.0])
  for name in ("learners", "slices", "links", "budget", "membership", "merges", "log"):
    assert restored[name].restored == saved[name].state, name
  at, event = restored["clock"].next_event()
  assert at == 4.0 and event.kind == EventKind.LEND and event.payload == (0, 1, 5.0)
  again.checkpoints.close()


def test_a_finished_run_saves_once_more_and_a_rerun_of_it_saves_nothing(tiny_config, tmp_path):
  tiny_config.checkpoint_every = 5
  run = modes.prepare(tiny_config)
  durability = _durability(run, tmp_path, _parts(run, version=1))
  durability.merged()
  durability.finish(_no_crash, tries=1)
  assert [final for _, _, final in durability.saves] == [True]
  again = _durability(run, tmp_path, _parts(run, version=0))
  again.restore()
  assert again.finished and again.merges_done == 1
  again.finish(_no_crash, tries=1)
  assert not again.saves
  assert set(again.figures()) == set() and np.isfinite(durability.figures()["final_save_ms"])


def _no_crash() -> None:
  raise AssertionError("no learner's process was found ended")


class _LostLearners(_Part):
  """Learners of which `lost` processes are found ended, one at each snapshot, until the controller crashes them."""

  def __init__(self, lost: int):
    super().__init__([dict(steps=3)], lost=lost, found=0, crashed=0)

  def snapshot(self, packer) -> dict:
    if self.found < self.lost:
      self.found += 1
      raise injection.ProcessLost(self.found, "process ended")
    return super().snapshot(packer)

  def crash_lost(self) -> None:
    self.crashed += 1


def test_a_learner_found_ended_by_the_final_checkpoint_is_crashed_and_the_checkpoint_taken_again(tiny_config,
                                                                                                  tmp_path):
  # (a learner in a Ray actor: its process found ended as its state is taken; its new process holds its book)
  tiny_config.checkpoint_every = 5
  run = modes.prepare(tiny_config)
  parts = dict(_parts(run, version=1), learners=_LostLearners(lost=2))
  durability = _durability(run, tmp_path, parts)
  durability.finish(parts["learners"].crash_lost, tries=3)
  assert parts["learners"].crashed == 2 and [final for _, _, final in durability.saves] == [True]
  again = _durability(run, tmp_path, _parts(run, version=0))
  again.restore()
  assert again.finished
  again.checkpoints.close()
  never = dict(_parts(run, version=1), learners=_LostLearners(lost=5))  # (new processes that keep dying: it gives up)
  durability = _durability(run, tmp_path / "never", never)
  durability.finish(never["learners"].crash_lost, tries=3)
  assert never["learners"].crashed == 3 and not durability.saves


def test_a_checkpoint_of_the_first_layout_resumes_with_each_owners_state_under_its_key():
  old = dict(merges_done=4, finished=False, merge_state="running", tokens_dispatched=640, reports_in_transit=1,
             syncer={}, learners=[], pool=dict(spares=[2]), crashes=dict(drawn=[1]), links={},
             ledger=dict(useful_seconds=3.0), clock={}, log={}, failed={}, arrays={},
             membership=dict(lent=[[4, 2]], drawn=[1], service=None))
  new = first_layout(old)
  assert new["merges"] == dict(merge_state="running") and new["slices"]["lent"] == [[4, 2]]
  assert new["budget"] == dict(tokens_dispatched=640, reports_in_transit=1, ledger=dict(useful_seconds=3.0))
  assert new["membership"] == dict(drawn=[1], service=None) and new["merges_done"] == 4
