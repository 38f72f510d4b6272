"""Staging a learner's next part off the controller thread: its batches stacked and sent to the slice ahead.

A learner's round is dispatched as one program over H batches. Reading, stacking and transferring them
is data work, not control: the stager does it on its own thread for the part that comes next, while
the current one trains, so that the controller's dispatch only picks up an array already on its way
to the slice. Positions are the stager's own (where the dispatched parts end), never the prefetcher's.
"""

import concurrent.futures
import dataclasses
from typing import Any

import jax
import numpy as np

from runtime.data import shards as data_lib
@dataclasses.dataclass(frozen=True)
class Staged:
  """One part's batches on their way to the slice, and the data positions it spans: one stacked array, or one per
  piece of a part run as several programs (runtime/diloco/round_plan.py: `chunks`)."""

  chunks: tuple[int, ...]  # the steps of each piece
  start: dict
  end: dict
  pieces: tuple[Any, ...]  # a jax.Array on the slice per piece (transfers possibly still in flight)
  tokens: int

  @property
  def steps(self) -> int:
    return sum(self.chunks)

  @property
  def batches_HxBxT(self) -> Any:
    """The part's batches, of a part in one piece."""
    (batches,) = self.pieces
    return batches


class Stager:
  """Hands out the next `steps` batches of a stream, stacked on a slice; stages the part after ahead."""

  def __init__(self, stream: data_lib.ShardIterator, prefetch: int, name: str):
    self._data = data_lib.Prefetcher(stream, depth=prefetch)
    self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"stage-{name}")
    self._ahead: concurrent.futures.Future | None = None  # the next part, staged
    self.position: dict = self._data.state()  # where the parts handed out so far end

  def take(self, steps: int | tuple[int, ...], sharding: jax.sharding.Sharding) -> Staged:
    """The next `steps` batches on `sharding` (a tuple: in pieces of those steps): the part staged ahead if it
    matches, else staged now."""
    chunks = _chunks(steps)
    staged_ahead, staged = self._ahead is not None, self._settle()
    if staged is None or (staged.chunks, staged.start, staged.pieces[0].sharding) != (chunks, self.position,
                                                                                         sharding):
      if staged_ahead:  # not what is asked for (or it failed): its data is served again
        self._data.restore(self.position)
      staged = self._stage(chunks, sharding)
    self.position = staged.end
    return staged

  def stage_ahead(self, steps: int | tuple[int, ...], sharding: jax.sharding.Sharding) -> None:
    """Starts staging the part expected next (a different request later falls back to staging then)."""
    if self._ahead is not None:  # staged and never taken: its data is served again
      self._drop_ahead()
      self._data.restore(self.position)
    self._ahead = self._thread.submit(self._stage, _chunks(steps), sharding)

  def restore(self, state: dict) -> None:
    """Serves the data from `state` on; anything staged is dropped."""
    self._drop_ahead()
    self._data.restore(state)
    self.position = state

  def _drop_ahead(self) -> None:
    """What is staged ahead is not wanted: a staging still waiting for its batches (a leased stream whose leases
    were given back, or not yet leased) is interrupted rather than awaited, which could be forever."""
    if self._ahead is not None and not self._ahead.done():
      self._data.interrupt()
    self._settle()

  def close(self) -> None:
    self._settle()
    self._thread.shutdown()
    self._data.close()

  def _settle(self) -> Staged | None:
    """Waits for the part staged ahead (the stream is touched by one thread at a time) and takes it."""
    ahead, self._ahead = self._ahead, None
    if ahead is None:
      return None
    try:
      return ahead.result()
    except Exception:  # pylint: disable=broad-except
      return None  # staged again in the caller's thread, where the error is raised for real

  def _stage(self, chunks: tuple[int, ...], sharding: jax.sharding.Sharding) -> Staged:
    start, pieces, tokens = self._data.state(), [], 0
    for steps in chunks:
      batches_HxBxT = np.stack([next(self._data) for _ in range(steps)])
      tokens += steps * batches_HxBxT.shape[1] * (batches_HxBxT.shape[2] - 1)
      pieces.append(jax.device_put(batches_HxBxT, sharding))
    return Staged(chunks, start, self._data.state(), tuple(pieces), tokens)


def _chunks(steps: int | tuple[int, ...]) -> tuple[int, ...]:
  return (steps,) if isinstance(steps, int) else tuple(steps)
