"""The controller's checkpoints: when one is due, saving everything that decides the rest of the run, restoring it.

A mixin of `Controller` (it uses the controller's clock, learners, syncer, slice pool, links, ledger and run log):
each part saves and restores its own state (`snapshot`/`restore`) at a merge's end, in-flight programs and
scheduled events included, so a killed run resumes where its newest checkpoint stood and, under the virtual
clock, goes on exactly as the run that was never killed.
"""

import json
import time

import numpy as np
from absl import logging

from runtime.checkpoint import snapshot as snapshot_lib
class Durability:
  """Checkpoints of the controller's whole state: due by merges or by the run's clock, saved off its thread."""

  def _checkpoint_due(self) -> bool:
    merges, at = self._saved
    every, seconds = self.run.checkpoint_every, self.run.checkpoint_seconds
    return self.checkpoints is not None and bool((every and self.merges_done - merges >= every)
                                                 or (seconds and self.clock.now() - at >= seconds))

  def _save_checkpoint(self, step: int) -> None:
    """Saves everything that decides the rest of the run, holding the controller up only for its snapshot.

    It also waits if the previous save is still gathering (which includes orbax waiting for the write before).
    The arrays are gathered to the host on the checkpoint thread (learners' states are copied on their slices
    first: their next round donates them); a learner's program that failed is saved as its device error.
    """
    start = time.perf_counter()
    packer = snapshot_lib.Packer(self.run.faults.schedule, self.treedefs)
    meta = dict(
        merges_done=self.merges_done, finished=self._finished, merge_state=self.merge_state,
        tokens_dispatched=self.tokens_dispatched, reports_in_transit=self.reports_in_transit,
        syncer=self.syncer.snapshot(packer), learners=[l.snapshot(packer) for l in self.learners],
        pool=self.pool.snapshot(), crashes=self.crashes.snapshot(), links=self.links.snapshot(),
        ledger=self.ledger.snapshot(), clock=self.clock.snapshot(packer.event), log=self.log.snapshot(),
        membership=self._membership_snapshot())
    meta = json.loads(json.dumps(meta))  # a copy, made now: the run goes on changing the lists it was built from
    groups = packer.groups

    def gather():
      arrays, failed = snapshot_lib.fetch(groups)
      shapes = {k: [list(np.shape(a)), np.asarray(a).dtype.name] for k, a in arrays.items()}
      return arrays, dict(meta, failed=failed, arrays=shapes)

    self.checkpoints.save_async(step, gather)
    self._saved = (self.merges_done, self.clock.now())
    self.saves.append((self.clock.now(), time.perf_counter() - start, self._finished))

  def _save_figures(self) -> dict:
    """What the periodic saves held the controller up (ms), their number and mean interval (the run's clock, s)."""
    periodic = [(at, held) for at, held, final in self.saves if not final]
    figures = {"final_save_ms": 1e3 * held for _, held, final in self.saves if final}
    if periodic:
      times, held = zip(*periodic)
      figures.update(checkpoints=len(periodic), save_block_ms=1e3 * float(np.mean(held)),
                     save_block_ms_max=1e3 * max(held))
      if len(periodic) > 1:
        figures["save_interval_s"] = float(np.mean(np.diff(times)))
    return figures

  def _restore(self) -> dict | None:
    """Restores the newest sound checkpoint, if any; returns the run log's part (the logger is made with it)."""
    restored = self.checkpoints.restore_latest(
        lambda meta: {k: np.empty(shape, dtype) for k, (shape, dtype) in meta["arrays"].items()})
    if restored is None:
      return None
    step, arrays, meta = restored
    unpacker = snapshot_lib.Unpacker(arrays, meta["failed"], self.run.faults.schedule, self.treedefs,
                                     self.host_sharding)
    self.syncer.restore(meta["syncer"], unpacker)
    for learner, saved in zip(self.learners, meta["learners"]):
      slices = tuple(saved["slices"])
      if slices and slices != learner.slices:
        learner.move_to(slices, [self.slices[s] for s in slices])
      learner.restore(saved, unpacker, self.syncer.params)
    self.pool.restore(meta["pool"])
    self.crashes.restore(meta["crashes"])
    self.links.restore(meta["links"])
    self.ledger.restore(meta["ledger"])
    self._membership_restore(meta["membership"])
    self.clock.restore(meta["clock"], unpacker.event)
    self.merges_done, self._finished, self.merge_state = meta["merges_done"], meta["finished"], meta["merge_state"]
    self.tokens_dispatched, self.reports_in_transit = meta["tokens_dispatched"], meta["reports_in_transit"]
    self._saved = (self.merges_done, self.clock.now())
    logging.info("%s: resumed from %s (merge %d, %d tokens merged)", self.name, self.checkpoints.directory / str(step),
                 self.merges_done, meta["log"]["tokens_merged"])
    return meta["log"]
