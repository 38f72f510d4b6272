"""A data service on the controller: disjoint windows of one global stream, handed to learners on demand.

The stream does not depend on how many learners there are. Its windows (seq_len + 1 tokens each) are
visited in seeded epoch orders laid end to end; the n-th window visited is the stream's *serial* n.
The controller leases serials to a learner as it dispatches (always on the controller's thread, so a
virtual-clock run leases the same serials every time); a learner that leaves gives back what it has
not reported, and the next lease serves what was given back first. So learners that join, leave, crash
and rejoin never skip or repeat a window: each serial is trained into Θ at most once, and every serial
below the service's frontier is merged, held by a learner, or waiting to be served again.
"""

import collections
import threading

import numpy as np

from runtime.data import shards as data_lib
from runtime.errors import DataError


class DataService:
  """Leases serials of the global window stream: given-back serials first, then fresh ones."""

  def __init__(self, tokens: np.ndarray, *, seq_len: int, seed: int):
    self._windows = data_lib.cut_windows(tokens, seq_len, 1)
    if not len(self._windows):
      raise DataError(f"the training split has {len(tokens)} tokens: fewer than one window of seq_len + 1")
    self.seq_len, self.seed = seq_len, seed
    self.frontier = 0  # serials ever handed out fresh: [0, frontier)
    self._returned: collections.deque[int] = collections.deque()  # given back, served first, oldest first
    self._permutations: dict[int, np.ndarray] = {}
    self._lock = threading.Lock()

  def lease(self, count: int) -> np.ndarray:
    """The next `count` serials (int64): given-back ones first, then fresh ones."""
    with self._lock:
      again = [self._returned.popleft() for _ in range(min(count, len(self._returned)))]
      fresh = np.arange(self.frontier, self.frontier + count - len(again), dtype=np.int64)
      self.frontier += len(fresh)
    return np.concatenate([np.asarray(again, np.int64), fresh])

  def give_back(self, serials: np.ndarray) -> None:
    """Serials leased and never trained into Θ: the next leases serve them again, in this order."""
    with self._lock:
      self._returned.extend(int(s) for s in serials)

  @property
  def returned(self) -> list[int]:
    return list(self._returned)

  def windows(self, serials: np.ndarray) -> np.ndarray:
    """The windows (int32, [len(serials), seq_len + 1]) that `serials` name."""
    epochs, offsets = np.divmod(np.asarray(serials, np.int64), len(self._windows))
    ids = np.empty_like(offsets)
    for epoch in np.unique(epochs):
      ids[epochs == epoch] = self._permutation(int(epoch))[offsets[epochs == epoch]]
    return self._windows[ids].astype(np.int32)

  def snapshot(self) -> dict:
    return dict(frontier=self.frontier, returned=self.returned)

  def restore(self, saved: dict) -> None:
    with self._lock:
      self.frontier, self._returned = saved["frontier"], collections.deque(saved["returned"])

  def __getstate__(self) -> dict:  # (a copy serves windows only: see Grants)
    return dict(self.__dict__, _lock=None)

  def __setstate__(self, state: dict) -> None:
    self.__dict__.update(state, _lock=threading.Lock())

  def _permutation(self, epoch: int) -> np.ndarray:
    with self._lock:
      if epoch not in self._permutations:
        if len(self._permutations) >= 4:
          del self._permutations[min(self._permutations)]
        self._permutations[epoch] = np.random.default_rng([self.seed, 104729, epoch]).permutation(len(self._windows))
      return self._permutations[epoch]


class Grants:
  """The service as a learner in another process sees it (backend "ray"): its windows, from a copy of the service's
  stream, and its leases, granted by the controller's service with each call that needs them. The controller leases
  exactly what the learner's stream will ask for (LeasedStream.lease_through, run on both sides), so a run leases the
  same serials as in process; a lease that is not the grant is a defect, raised."""

  def __init__(self, service: DataService):
    self._service = service  # (a copy in the learner's process: never leased from there)
    self.seq_len, self.seed = service.seq_len, service.seed
    self._granted = np.zeros(0, np.int64)

  def grant(self, serials: np.ndarray | None) -> None:
    """The serials the controller leased for the next `lease` (None: nothing granted any more)."""
    self._granted = np.zeros(0, np.int64) if serials is None else np.asarray(serials, np.int64)

  def lease(self, count: int) -> np.ndarray:
    granted, self._granted = self._granted, np.zeros(0, np.int64)
    if len(granted) != count:
      raise DataError(f"a lease of {count} serials where the controller granted {len(granted)}: the learner's "
                      "stream and the controller's copy of it disagree")
    return granted

  def give_back(self, serials: np.ndarray) -> None:
    del serials  # (the controller gives its copy's back: LeasedStream.give_back_from, on both sides)

  def windows(self, serials: np.ndarray) -> np.ndarray:
    return self._service.windows(serials)


class LeasedStream(data_lib.BatchStream):
  """One learner's batches from the service: batch p is the windows of its serials [p·B, (p+1)·B).

  It serves positions like a `ShardIterator` (so the prefetcher and stager work unchanged) but only
  positions whose serials are leased; the prefetcher waits (`wait_ready`) for the controller to lease more.
  """

  def __init__(self, service: DataService, *, batch_size: int, learner: int):
    self._service, self._batch_size, self._learner = service, batch_size, learner
    self._leases = np.zeros(0, np.int64)
    self._position = 0
    self._ready = threading.Condition()

  @property
  def tokens_per_batch(self) -> int:
    return self._batch_size * self._service.seq_len

  @property
  def leased(self) -> int:
    """Batches leased so far (positions [0, leased) can be served)."""
    return len(self._leases) // self._batch_size

  def lease_through(self, batches: int) -> np.ndarray:
    """Leases serials until positions [0, batches) can be served (on the controller's thread); those it leased."""
    missing = batches * self._batch_size - len(self._leases)
    if missing <= 0:
      return np.zeros(0, np.int64)
    with self._ready:
      fresh = self._service.lease(missing)
      self._leases = np.concatenate([self._leases, fresh])
      self._ready.notify_all()
    return fresh

  def remote(self) -> "LeasedStream":
    """This stream as a learner in another process holds it: its leases, granted by this one's service (Grants)."""
    stream = LeasedStream(Grants(self._service), batch_size=self._batch_size, learner=self._learner)
    stream.restore_leases(self.snapshot())
    return stream

  @property
  def grants(self) -> Grants | None:
    """Where a stream in another process takes its leases from (None: this process's service)."""
    return self._service if isinstance(self._service, Grants) else None

  def __getstate__(self) -> dict:
    return dict(self.__dict__, _ready=None)

  def __setstate__(self, state: dict) -> None:
    self.__dict__.update(state, _ready=threading.Condition())

  def give_back_from(self, position: int) -> None:
    """Gives back the serials of positions >= `position` to the service (the learner never trains them)."""
    with self._ready:
      cut = position * self._batch_size
      self._service.give_back(self._leases[cut:])
      self._leases = self._leases[:cut]

  def serials(self, start: int, end: int) -> np.ndarray:
    """The serials of positions [start, end)."""
    with self._ready:
      return self._leases[start * self._batch_size:end * self._batch_size].copy()

  def wait_ready(self, stop: threading.Event, poll_seconds: float) -> bool:
    """Blocks until the next position is leased (True) or `stop` is set (False)."""
    with self._ready:
      while not stop.is_set():
        if len(self._leases) >= (self._position + 1) * self._batch_size:
          return True
        self._ready.wait(poll_seconds)
    return False

  def batch_at(self, position: int) -> np.ndarray:
    serials = self.serials(position, position + 1)
    if len(serials) < self._batch_size:
      raise DataError(f"learner {self._learner}'s batch {position} is not leased (leased: {self.leased} batches)")
    return self._service.windows(serials)

  def snapshot(self) -> list[int]:
    """The learner's leased serials (its position is the stager's)."""
    with self._ready:
      return self._leases.tolist()

  def restore_leases(self, leases: list[int]) -> None:
    with self._ready:
      self._leases = np.asarray(leases, np.int64)

  def _settings(self) -> dict[str, int]:
    return {"batch_size": self._batch_size, "seq_len": self._service.seq_len, "seed": self._service.seed,
            "learner": self._learner}
