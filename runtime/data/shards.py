"""Per-learner batches: disjoint shards, seeded epoch orders, resumable positions, prefetch."""

import queue
import threading
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from runtime.errors import DataError

if TYPE_CHECKING:
  from runtime.data import prepared


def shard_bounds(num_tokens: int, num_shards: int, shard_index: int) -> tuple[int, int]:
  """[start, end) of shard `shard_index`: contiguous, disjoint, covering, sizes within 1."""
  if num_tokens < 0:
    raise DataError(f"num_tokens = {num_tokens!r} is invalid: allowed an integer >= 0")
  if num_shards < 1:
    raise DataError(f"num_shards = {num_shards!r} is invalid: allowed an integer >= 1")
  if not 0 <= shard_index < num_shards:
    raise DataError(
        f"shard_index = {shard_index!r} is invalid: allowed 0 <= shard_index < {num_shards}")
  return (shard_index * num_tokens // num_shards, (shard_index + 1) * num_tokens // num_shards)


# "contiguous": shard i is the i-th span of the stream (whole files: non-IID across shards);
# "strided": shard i holds windows i, i + M, i + 2M, ... (every shard samples the whole corpus).
SHARD_LAYOUTS = ("contiguous", "strided")


class BatchStream:
  """Batches served by position: `batch_at(p)` is pure, iteration moves the position, a saved position resumes.

  Subclasses define `batch_at` and `_settings` (the settings a saved position is only meaningful under).
  """

  _position = 0

  def __iter__(self) -> "BatchStream":
    return self

  def __next__(self) -> np.ndarray:
    batch = self.batch_at(self._position)
    self._position += 1
    return batch

  @property
  def position(self) -> int:
    """Number of batches served so far; the next batch is `batch_at(position)`."""
    return self._position

  def state(self) -> dict[str, int]:
    """JSON-serializable position plus the settings it is only meaningful under."""
    return {"position": self._position, **self._settings()}

  def restore(self, state: dict[str, int]) -> None:
    """Makes the next batch the one at `state["position"]`; recorded settings must match."""
    self._position = saved_position(state, self._settings())

  def batch_at(self, position: int) -> np.ndarray:
    raise NotImplementedError

  def _settings(self) -> dict[str, int]:
    raise NotImplementedError


class ShardIterator(BatchStream):
  """Batches [batch_size, seq_len + 1] of int32 from one shard's windows, in seeded epoch order.

  The whole stream is cut into disjoint windows of seq_len + 1 tokens (window g is tokens
  [g * (seq_len + 1), (g + 1) * (seq_len + 1)); its last token is only a target), then the windows
  are sharded with `shard_bounds`, so window ids are global and no token is in two shards. Epoch e
  visits the shard's windows in a permutation seeded by (seed, shard_index, e); batch p holds
  positions p * batch_size ... of the epochs laid end to end, so a batch may span two epochs.
  """

  def __init__(self, tokens: np.ndarray, *, batch_size: int, seq_len: int,
               num_shards: int = 1, shard_index: int = 0, seed: int = 0, layout: str = "contiguous"):
    self._windows = cut_windows(tokens, seq_len, batch_size)
    if layout not in SHARD_LAYOUTS:
      raise DataError(f"shard layout = {layout!r} is invalid: allowed one of {SHARD_LAYOUTS}")
    self._strided = layout == "strided"
    if self._strided:  # window g belongs to shard g % num_shards: every shard samples the whole corpus
      shard_bounds(len(self._windows), num_shards, shard_index)  # validates the arguments
      self._first = shard_index
      self._num_windows = len(range(shard_index, len(self._windows), num_shards))
    else:
      self._first, end = shard_bounds(len(self._windows), num_shards, shard_index)
      self._num_windows = end - self._first
    if self._num_windows < batch_size:
      window = seq_len + 1
      raise DataError(
          f"shard {shard_index} of {num_shards} has {self._num_windows * window} tokens "
          f"({self._num_windows} windows of seq_len + 1 = {window}) but one batch needs "
          f"batch_size * {window} = {batch_size * window} tokens; use fewer learners, a smaller "
          "batch or sequence, or a larger corpus")
    self._batch_size = batch_size
    self._seq_len = seq_len
    self._num_shards = num_shards
    self._shard_index = shard_index
    self._seed = seed
    self._position = 0
    self._permutations: dict[int, np.ndarray] = {}

  @property
  def num_windows(self) -> int:
    """Windows in this shard, i.e. the windows one epoch visits."""
    return self._num_windows

  @property
  def tokens_per_batch(self) -> int:
    """Predicted tokens per batch: batch_size * seq_len (a window's first token is no target)."""
    return self._batch_size * self._seq_len

  def window_ids(self, position: int) -> np.ndarray:
    """Global window ids (int64, [batch_size]) that batch `position` is made of."""
    if position < 0:
      raise DataError(f"batch position = {position!r} is invalid: allowed an integer >= 0")
    flat = np.arange(position * self._batch_size, (position + 1) * self._batch_size, dtype=np.int64)
    epochs, offsets = np.divmod(flat, self._num_windows)
    local = np.empty_like(flat)
    for epoch in np.unique(epochs):
      in_epoch = epochs == epoch
      local[in_epoch] = self._permutation(int(epoch))[offsets[in_epoch]]
    return self._first + local * self._num_shards if self._strided else self._first + local

  def batch_at(self, position: int) -> np.ndarray:
    """Batch `position` (int32, [batch_size, seq_len + 1]) without moving the iterator."""
    return self._windows[self.window_ids(position)].astype(np.int32)

  def _permutation(self, epoch: int) -> np.ndarray:
    """The shard-local window order of `epoch`, cached for the two epochs a batch can span."""
    if epoch not in self._permutations:
      if len(self._permutations) >= 2:
        del self._permutations[min(self._permutations)]
      rng = np.random.default_rng([self._seed, self._shard_index, epoch])
      self._permutations[epoch] = rng.permutation(self._num_windows)
    return self._permutations[epoch]

  def _settings(self) -> dict[str, int]:
    """The constructor settings a saved position depends on."""
    return {"batch_size": self._batch_size, "seq_len": self._seq_len,
            "num_shards": self._num_shards, "shard_index": self._shard_index, "seed": self._seed}


def saved_position(state: dict[str, int], settings: dict[str, int]) -> int:
  """The position of a saved data state, checked: an integer >= 0, saved under these `settings`."""
  position = state.get("position")
  if not isinstance(position, int) or isinstance(position, bool) or position < 0:
    raise DataError(f"data state 'position' = {position!r} is invalid: allowed an integer >= 0")
  for key, value in settings.items():
    if key in state and state[key] != value:
      raise DataError(f"data state '{key}' = {state[key]!r} does not match this stream's {value!r}; "
                      "a position only resumes the same stream under the same settings")
  return position


class _Failure:
  """Carries an exception from the producer thread to the consumer."""

  def __init__(self, error: BaseException):
    self.error = error


class PrefetchInterrupted(RuntimeError):
  """A batch was awaited from a prefetcher that was interrupted (its producer stopped)."""


class Prefetcher:
  """Runs a ShardIterator (and `transform`, e.g. a device put) ahead in a daemon thread."""

  _POLL_S = 0.05  # How often a producer blocked on a full queue checks for stop.

  def __init__(self, iterator: ShardIterator, *, depth: int = 2,
               transform: Callable[[np.ndarray], Any] | None = None):
    if depth < 1:
      raise DataError(f"prefetch depth = {depth!r} is invalid: allowed an integer >= 1")
    self._iterator = iterator
    self._depth = depth
    self._transform = transform
    self._position = iterator.position
    self._error: BaseException | None = None
    self._thread: threading.Thread | None = None
    self._start()

  def __iter__(self) -> "Prefetcher":
    return self

  def __next__(self) -> Any:
    if self._error is not None:
      raise self._error
    if self._thread is None:
      raise RuntimeError("Prefetcher is closed")
    while True:
      try:
        item = self._queue.get(timeout=self._POLL_S)
        break
      except queue.Empty:
        if self._stop_event.is_set():  # (interrupted: what it waits for, e.g. a lease given back, may never come)
          raise PrefetchInterrupted("the prefetcher was interrupted while a batch was awaited") from None
    if isinstance(item, _Failure):
      self._error = item.error
      raise item.error
    self._position += 1
    return item

  def __enter__(self) -> "Prefetcher":
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()

  @property
  def position(self) -> int:
    """Batches the caller has received; the producer may be up to `depth` + 1 ahead."""
    return self._position

  def state(self) -> dict[str, int]:
    """The inner iterator's state at the caller's position, not the producer's."""
    return {**self._iterator.state(), "position": self._position}

  def restore(self, state: dict[str, int]) -> None:
    """Discards what was prefetched and resumes at `state`'s position."""
    self._stop()
    self._iterator.restore(state)
    self._position = self._iterator.position
    self._error = None
    self._start()

  def close(self) -> None:
    """Stops the producer thread; idempotent."""
    self._stop()

  def interrupt(self) -> None:
    """Asks the producer to stop, without waiting: a caller of `next` then takes what is queued and, once it is
    empty, raises PrefetchInterrupted instead of waiting. `restore` starts it again."""
    if self._thread is not None:
      self._stop_event.set()

  def _start(self) -> None:
    """Starts a producer at the inner iterator's position."""
    # A fresh queue and event per thread, so a stopped producer can never feed its successor.
    self._queue: queue.Queue[Any] = queue.Queue(maxsize=self._depth)
    self._stop_event = threading.Event()
    self._thread = threading.Thread(
        target=self._produce, args=(self._queue, self._stop_event), name="prefetch", daemon=True)
    self._thread.start()

  def _stop(self) -> None:
    """Joins the producer and rewinds the inner iterator to the caller's position."""
    if self._thread is None:
      return
    self._stop_event.set()
    self._thread.join()
    self._thread = None
    self._iterator.restore({"position": self._position})

  def _produce(self, out: "queue.Queue[Any]", stop: threading.Event) -> None:
    """Producer thread body: batches, transformed, into `out` until stopped or failed."""
    try:
      wait_ready = getattr(self._iterator, "wait_ready", None)  # a leased stream: its next batch may not be yet
      while not stop.is_set():
        if wait_ready is not None and not wait_ready(stop, self._POLL_S):
          return
        item = next(self._iterator)
        if not self._put(out, stop, item if self._transform is None else self._transform(item)):
          return
    except BaseException as error:  # Whatever failed, the consumer must see it, not hang.
      self._put(out, stop, _Failure(error))

  def _put(self, out: "queue.Queue[Any]", stop: threading.Event, item: Any) -> bool:
    """Blocks until `item` is queued (True) or stop is requested (False)."""
    while not stop.is_set():
      try:
        out.put(item, timeout=self._POLL_S)
        return True
      except queue.Full:
        continue
    return False


def eval_batches(tokens: np.ndarray, *, batch_size: int, seq_len: int,
                 num_batches: int) -> np.ndarray:
  """Fixed eval set (int32, [num_batches, batch_size, seq_len + 1]) of evenly spaced windows.

  A split too small for that many windows gives as many whole batches of `batch_size` as its windows fill (evenly
  spaced over them), or one batch of all of them when they fill none (the caller says so: `short_of`).
  """
  windows = cut_windows(tokens, seq_len, batch_size)
  if num_batches < 1:
    raise DataError(f"num_batches = {num_batches!r} is invalid: allowed an integer >= 1")
  if not len(windows):
    raise DataError(
        f"the eval split has {len(tokens)} tokens: not one window of seq_len + 1 = {seq_len + 1}; raise "
        "data.eval_fraction (a prepared dataset: prepare it with a larger --eval_fraction) or lower data.seq_len")
  if len(windows) < num_batches * batch_size:
    num_batches, batch_size = max(len(windows) // batch_size, 1), min(batch_size, len(windows))
  needed = num_batches * batch_size
  ids = np.arange(needed, dtype=np.int64) * len(windows) // needed
  return windows[ids].astype(np.int32).reshape(num_batches, batch_size, seq_len + 1)


def short_of(batches: np.ndarray, num_batches: int, batch_size: int) -> str:
  """'' when `batches` (from eval_batches) holds the windows asked for; else one line saying what it holds."""
  if batches.shape[:2] == (num_batches, batch_size):
    return ""
  return (f"the eval split holds {batches.shape[0] * batches.shape[1]} windows of {batches.shape[2]} tokens, fewer "
          f"than {num_batches} batches of {batch_size}: evaluating on {batches.shape[0]} batch(es) of "
          f"{batches.shape[1]}; a larger eval split evaluates more precisely")


def cut_windows(tokens: "np.ndarray | prepared.TokenSplit", seq_len: int, batch_size: int) -> Any:
  """Disjoint windows of seq_len + 1 tokens, dropping the tail: a [num_windows, seq_len + 1] view of an array in
  memory, or a prepared split's `Windows` (the same indexing, read from disk)."""
  if seq_len < 1:
    raise DataError(f"seq_len = {seq_len!r} is invalid: allowed an integer >= 1")
  if batch_size < 1:
    raise DataError(f"batch_size = {batch_size!r} is invalid: allowed an integer >= 1")
  if not isinstance(tokens, np.ndarray):
    return tokens.windows(seq_len)
  if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
    raise DataError(
        f"tokens must be a 1-D integer array, got {tokens.dtype} of shape {tokens.shape}")
  window = seq_len + 1
  count = len(tokens) // window
  return tokens[:count * window].reshape(count, window)
