"""Durability on its own: each part's snapshot saved at a merge's end and handed back to it on restore."""

import jax
import numpy as np

from runtime.diloco.clock import Event, EventKind, make_clock
from runtime.diloco.durability import Durability
from runtime.diloco.ledger import Ledger
from runtime.experiments import modes


class _Part:
  """A part whose state is a dict: what it saved, and what it was handed back."""

  def __init__(self, state: dict, **attributes):
    self.state, self.restored = state, None
    vars(self).update(attributes)

  def snapshot(self, packer=None) -> dict:
    del packer
    return self.state

  def restore(self, saved: dict, *unpacker_and_theta) -> None:
    del unpacker_and_theta
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
  clock = make_clock(run.clock, run.learners, run.seed)
  return dict(
      clock=clock, syncer=_Syncer(version),
      learners=[_Part(dict(slices=[m], steps=version + m), slices=(m,)) for m in range(run.learners)],
      merges=_Part(dict(merge_state="scheduled" if version else "idle")),
      rounds=_Part(dict(tokens_dispatched=100 * version, reports_in_transit=version)),
      slices=_Part(dict(pool=dict(spares=[version]), crashes=dict(drawn=[version]))),
      links=_Part(dict(bytes_up=version)), ledger=Ledger(run.num_slices), membership=_Part(dict(drawn=[version])),
      log=_Part(dict(tokens_merged=7 * version, records=version)))


def _durability(run, tmp_path, parts):
  log = parts["log"]
  devices = [[d] for d in jax.devices()[:run.num_slices]]
  host = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return Durability(run, tmp_path, "run", {}, host, devices, parts["clock"], parts["syncer"], parts["learners"],
                    parts["merges"], parts["rounds"], parts["slices"], parts["links"], parts["ledger"],
                    parts["membership"], lambda: log)


def test_a_checkpoint_hands_every_part_its_own_saved_state_back(tiny_config, tmp_path):
  tiny_config.checkpoint_every = 2
  run = modes.prepare(tiny_config)
  saved = _parts(run, version=3)
  saved["ledger"].useful(12.5)
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
  for name in ("links", "membership"):
    assert restored[name].restored == saved[name].state, name
  assert restored["merges"].restored["merge_state"] == "scheduled"  # (flat keys of the checkpoint's JSON, as ever)
  rounds, slices = restored["rounds"].restored, restored["slices"].restored
  assert rounds["tokens_dispatched"] == 300 and rounds["reports_in_transit"] == 3
  assert slices["pool"] == dict(spares=[3]) and slices["crashes"]["drawn"] == [3]
  assert [l.restored for l in restored["learners"]] == [l.state for l in saved["learners"]]
  assert restored["ledger"].useful_seconds == 12.5
  at, event = restored["clock"].next_event()
  assert at == 4.0 and event.kind == EventKind.LEND and event.payload == (0, 1, 5.0)
  again.checkpoints.close()


def test_a_finished_run_saves_once_more_and_a_rerun_of_it_saves_nothing(tiny_config, tmp_path):
  tiny_config.checkpoint_every = 5
  run = modes.prepare(tiny_config)
  durability = _durability(run, tmp_path, _parts(run, version=1))
  durability.merged()
  durability.finish()
  assert [final for _, _, final in durability.saves] == [True]
  again = _durability(run, tmp_path, _parts(run, version=0))
  again.restore()
  assert again.finished and again.merges_done == 1
  again.finish()
  assert not again.saves
  assert set(again.figures()) == set() and np.isfinite(durability.figures()["final_save_ms"])
