"""The run's checkpoints: when one is due, saving everything that decides the rest of the run, restoring it.

`Durability` is given (key, part) pairs by the controller, one per owner of state. At a merge's end it asks each
part for its state (`snapshot(packer)`: JSON, its arrays packed; in-flight programs and scheduled events included)
and saves it under the part's key; on resume it hands each part its own back (`restore(saved, unpacker)`), in the
order given, so a killed run resumes where its newest checkpoint stood and, under the virtual clock, goes on exactly as
the run that was never killed. Checkpoints are numbered by the merges handled, which it counts.
"""

import json
import os
import pathlib
import time
from typing import Any, Callable, Protocol, Sequence

import jax
import numpy as np
from absl import logging

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.checkpoint.store import Checkpoints
from runtime.config.run import RunConfig
from runtime.diloco.sync import messages
from runtime.faults import injection
from runtime.periodic import SinceLast

LAYOUT = 2  # 2: each part under its owner's key; 1 (no "layout" field): the keys of checkpoints before it


class Part(Protocol):
  """An owner of state that a checkpoint saves."""

  def snapshot(self, packer: snapshot_lib.Packer) -> Any: ...

  def restore(self, saved: Any, unpacker: snapshot_lib.Unpacker) -> None: ...


class Durability:
  """Checkpoints of every part's state: due by merges or by the run's clock, saved off the controller's thread."""

  def __init__(self, run: RunConfig, directory: str | os.PathLike | None, name: str, treedefs: dict,
               host_sharding: jax.sharding.Sharding, clock, parts: Sequence[tuple[str, Part]]):
    self._run, self._name, self._treedefs, self._host_sharding = run, name, treedefs, host_sharding
    self._clock, self._parts = clock, tuple(parts)  # (the clock, also a part, says when a save is due)
    self.checkpoints = None
    if directory is not None and run.checkpoints:
      self.checkpoints = Checkpoints(pathlib.Path(directory) / name / "checkpoints", run.checkpoint_keep)
    self.merges_done = 0  # merges handled (committed or not): checkpoints are numbered by them
    self._schedule = SinceLast(run.checkpoint_every, run.checkpoint_seconds)  # from the last checkpoint
    self._by_wall = SinceLast(seconds=run.checkpoint_wall_seconds, at=time.monotonic())  # the host's seconds
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
    if self._saved_at != self.merges_done:
      return f"checkpoint {self.merges_done} not saved (a learner's process was found ended): the newest one is kept"
    return (f"checkpoint {self.merges_done} saved" if fresh else
            f"checkpoint {self.merges_done} (saved at that merge) kept; the work since is done again")

  def finish(self, crash_lost: Callable[[], None], tries: int) -> None:
    """The run ended: a final checkpoint (unless it was restored from one), and every save finished. A learner whose
    process is found ended as its state is taken crashes (`crash_lost`, as in the run: a new process holds its book)
    and the checkpoint is taken again, up to `tries` times."""
    if self.checkpoints is None:
      return
    if not self.finished:  # a rerun of the finished run resumes from here, and only reports
      self.finished = True
      while not self.save(self.merges_done + 1) and tries > 0:
        crash_lost()
        tries -= 1
    self.checkpoints.close()

  def close(self) -> None:
    """The run failed: the saves begun are finished; their errors never hide the run's."""
    if self.checkpoints is not None:
      self.checkpoints.close(quiet=True)

  def _due(self) -> bool:
    return self.checkpoints is not None and (self._schedule.due(self.merges_done, self._clock.now())
                                             or self._by_wall.due(0, time.monotonic()))

  def save(self, step: int) -> bool:
    """Saves everything that decides the rest of the run, holding the controller up only for its snapshot; False
    (nothing saved) where a learner's process was found ended.

    It also waits if the previous save is still gathering (which includes orbax waiting for the write before).
    The arrays are gathered to the host on the checkpoint thread (learners' states are copied on their slices
    first: their next round donates them); a learner's program that failed is saved as its device error.
    """
    start = time.perf_counter()
    packer = snapshot_lib.Packer(self._run.faults.schedule, self._treedefs, messages.CODECS)
    try:
      meta = dict(layout=LAYOUT, merges_done=self.merges_done, finished=self.finished,
                  **{key: part.snapshot(packer) for key, part in self._parts})
    except injection.ProcessLost as lost:  # its crash comes first (the controller's loop): the save stays due
      logging.warning("%s: checkpoint %d not saved: %s", self._name, step, lost)
      return False
    meta = json.loads(json.dumps(meta))  # a copy, made now: the run goes on changing the lists it was built from
    groups, failed_elsewhere = packer.groups, dict(packer.failed)

    def gather():
      arrays, failed = snapshot_lib.fetch(groups)
      failed.update(failed_elsewhere)
      shapes = {k: [list(np.shape(a)), np.asarray(a).dtype.name] for k, a in arrays.items()}
      return arrays, dict(meta, failed=failed, arrays=shapes)

    self.checkpoints.save_async(step, gather)
    self._saved_at = self.merges_done
    if not self._run.progress:
      logging.info("%s: checkpoint %d saving (%s)", self._name, step, self.checkpoints.directory)
    self._schedule.done(self.merges_done, self._clock.now())
    self._by_wall.done(0, time.monotonic())
    self.saves.append((self._clock.now(), time.perf_counter() - start, self.finished))
    return True

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
    meta = meta if meta.get("layout") == LAYOUT else first_layout(meta)
    unpacker = snapshot_lib.Unpacker(arrays, meta["failed"], self._run.faults.schedule, self._treedefs,
                                     self._host_sharding, messages.CODECS)
    for key, part in self._parts:
      part.restore(meta[key], unpacker)
    self.merges_done, self.finished = meta["merges_done"], meta["finished"]
    self._saved_at = self.merges_done
    self._schedule.done(self.merges_done, self._clock.now())
    self._by_wall.done(0, time.monotonic())
    logging.info("%s: resumed from %s (merge %d, %d tokens merged)", self._name,
                 self.checkpoints.directory / str(step), self.merges_done, meta["log"]["tokens_merged"])
    return meta["log"]


def first_layout(meta: dict) -> dict:
  """A checkpoint of the first layout (written before each owner had its key) in today's: the same state, moved."""
  membership = meta["membership"]
  return dict(
      meta, merges=dict(merge_state=meta["merge_state"]),
      budget=dict(tokens_dispatched=meta["tokens_dispatched"], reports_in_transit=meta["reports_in_transit"],
                  ledger=meta["ledger"]),
      slices=dict(pool=meta["pool"], crashes=meta["crashes"], lent=membership["lent"]),
      membership=dict(drawn=membership["drawn"], service=membership["service"]))
