"""The run's checkpoints: when one is due, saving everything that decides the rest of the run, restoring it.

`Durability` asks each part for its state (`snapshot`) at a merge's end, in-flight programs and scheduled events
included, and hands each part its saved state back (`restore`), so a killed run resumes where its newest checkpoint
stood and, under the virtual clock, goes on exactly as the run that was never killed. Checkpoints are numbered by
the merges handled, which it counts.
"""

import functools
import json
import os
import pathlib
import time
from typing import Callable, Sequence

import jax
import numpy as np
from absl import logging

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.checkpoint.store import Checkpoints
from runtime.config.run import RunConfig
from runtime.diloco import clock as clock_lib
from runtime.diloco.sync import messages
from runtime.diloco.learner.learner import Learner
from runtime.diloco.ledger import Ledger
from runtime.diloco.membership import Membership
from runtime.diloco.merge_schedule import MergeSchedule
from runtime.diloco.rounds import Rounds
from runtime.diloco.run_log import RunLog
from runtime.diloco.slices.lifecycle import SliceLifecycle
from runtime.diloco.sync.syncer import Syncer
from runtime.network.links import Links
from runtime.periodic import SinceLast


class Durability:
  """Checkpoints of every part's state: due by merges or by the run's clock, saved off the controller's thread."""

  def __init__(self, run: RunConfig, directory: str | os.PathLike | None, name: str, treedefs: dict,
               host_sharding: jax.sharding.Sharding, devices: Sequence[list[jax.Device]], clock, syncer: Syncer,
               learners: Sequence[Learner], merges: MergeSchedule, rounds: Rounds, slices: SliceLifecycle,
               links: Links, ledger: Ledger, membership: Membership, log: Callable[[], RunLog]):
    self._run, self._name, self._treedefs, self._host_sharding = run, name, treedefs, host_sharding
    self._devices = devices
    self._clock, self._syncer, self._learners, self._merges, self._rounds = clock, syncer, learners, merges, rounds
    self._slices, self._links, self._ledger, self._membership, self._log = slices, links, ledger, membership, log
    self.checkpoints = None
    if directory is not None and (run.checkpoint_every or run.checkpoint_seconds):
      self.checkpoints = Checkpoints(pathlib.Path(directory) / name / "checkpoints", run.checkpoint_keep)
    self.merges_done = 0  # merges handled (committed or not): checkpoints are numbered by them
    self._schedule = SinceLast(run.checkpoint_every, run.checkpoint_seconds)  # from the last checkpoint
    self.finished = False  # restored from the checkpoint a finished run saved last
    self.saves: list[tuple[float, float, bool]] = []  # per checkpoint: (clock time, seconds held up, final)
    self._saved_at = -1  # the merge of the newest checkpoint saved or restored

  def merged(self) -> None:
    """A merge was handled: it is counted, and a checkpoint saved if one is due."""
    self.merges_done += 1
    if self._due():
      self.save(self.merges_done)

  def save_now(self) -> str | None:
    """A stop was asked for (runtime/train/preemption.py): the state as it stands saved at once, committed and
    verified, unless the newest checkpoint is of this very merge; what was kept, or None without checkpoints."""
    if self.checkpoints is None:
      return None
    fresh = self._saved_at != self.merges_done
    if fresh:
      self.save(self.merges_done)
    self.checkpoints.flush()
    return (f"checkpoint {self.merges_done} saved" if fresh else
            f"checkpoint {self.merges_done} (saved at that merge) kept; the work since is done again")

  def finish(self) -> None:
    """The run ended: a final checkpoint (unless it was restored from one), and every save finished."""
    if self.checkpoints is None:
      return
    if not self.finished:  # a rerun of the finished run resumes from here, and only reports
      self.finished = True
      self.save(self.merges_done + 1)
    self.checkpoints.close()

  def close(self) -> None:
    """The run failed: the saves begun are finished; their errors never hide the run's."""
    if self.checkpoints is not None:
      self.checkpoints.close(quiet=True)

  def _due(self) -> bool:
    return self.checkpoints is not None and self._schedule.due(self.merges_done, self._clock.now())

  def save(self, step: int) -> None:
    """Saves everything that decides the rest of the run, holding the controller up only for its snapshot.

    It also waits if the previous save is still gathering (which includes orbax waiting for the write before).
    The arrays are gathered to the host on the checkpoint thread (learners' states are copied on their slices
    first: their next round donates them); a learner's program that failed is saved as its device error.
    """
    start = time.perf_counter()
    packer = snapshot_lib.Packer(self._run.faults.schedule, self._treedefs, messages.CODECS)
    meta = dict(
        merges_done=self.merges_done, finished=self.finished, **self._merges.snapshot(), **self._rounds.snapshot(),
        syncer=self._syncer.snapshot(packer), learners=[l.snapshot(packer) for l in self._learners],
        **self._slices.snapshot(), links=self._links.snapshot(), ledger=self._ledger.snapshot(),
        clock=self._clock.snapshot(functools.partial(clock_lib.pack_event, packer)), log=self._log().snapshot(), membership=self._membership.snapshot())
    meta = json.loads(json.dumps(meta))  # a copy, made now: the run goes on changing the lists it was built from
    groups = packer.groups

    def gather():
      arrays, failed = snapshot_lib.fetch(groups)
      shapes = {k: [list(np.shape(a)), np.asarray(a).dtype.name] for k, a in arrays.items()}
      return arrays, dict(meta, failed=failed, arrays=shapes)

    self.checkpoints.save_async(step, gather)
    self._saved_at = self.merges_done
    if not self._run.progress:
      logging.info("%s: checkpoint %d saving (%s)", self._name, step, self.checkpoints.directory)
    self._schedule.done(self.merges_done, self._clock.now())
    self.saves.append((self._clock.now(), time.perf_counter() - start, self.finished))

  def figures(self) -> dict:
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

  def restore(self) -> dict | None:
    """Restores the newest sound checkpoint, if any; returns the run log's part (the logger is made with it)."""
    if self.checkpoints is None or not self._run.resume:
      return None
    restored = self.checkpoints.restore_latest(
        lambda meta: {k: np.empty(shape, dtype) for k, (shape, dtype) in meta["arrays"].items()})
    if restored is None:
      return None
    step, arrays, meta = restored
    unpacker = snapshot_lib.Unpacker(arrays, meta["failed"], self._run.faults.schedule, self._treedefs,
                                     self._host_sharding, messages.CODECS)
    self._syncer.restore(meta["syncer"], unpacker)
    for learner, saved in zip(self._learners, meta["learners"]):
      slices = tuple(saved["slices"])
      if slices and slices != learner.slices:
        learner.move_to(slices, [self._devices[s] for s in slices])
      learner.restore(saved, unpacker, self._syncer.params)
    self._slices.restore(meta)
    self._links.restore(meta["links"])
    self._ledger.restore(meta["ledger"])
    self._membership.restore(meta["membership"])
    self._clock.restore(meta["clock"], functools.partial(clock_lib.unpack_event, unpacker))
    self._merges.restore(meta)
    self._rounds.restore(meta)
    self.merges_done, self.finished = meta["merges_done"], meta["finished"]
    self._saved_at = self.merges_done
    self._schedule.done(self.merges_done, self._clock.now())
    logging.info("%s: resumed from %s (merge %d, %d tokens merged)", self._name,
                 self.checkpoints.directory / str(step), self.merges_done, meta["log"]["tokens_merged"])
    return meta["log"]
