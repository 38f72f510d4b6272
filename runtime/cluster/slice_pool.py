"""Slice bookkeeping under failures: which slices are spare, which are in repair, which learners wait.

Pure bookkeeping (no devices, no clock): the controller tells the pool what happened and asks it
which slice or learner comes next. A learner of several slices waits once for each slice it lacks, and the pool
keeps the healthy slices each such learner holds (`owned`): those it trains on, and those kept for its return.
"""


class SlicePool:
  """Spare and repairing slices, learners waiting for a slice, and slices held for a pending rejoin."""

  def __init__(self, num_slices: int, in_use: int, per_learner: int = 1):
    self._spares = list(range(in_use, num_slices))  # healthy slices no learner uses, oldest first
    self._waiting: list[int] = []  # learners with no slice yet (one entry per slice lacked), in the order they get one
    # learner -> its healthy slices, ascending (learners of several slices only; learner m starts on m·k ... m·k+k-1)
    self._owned = {m: list(range(m * per_learner, (m + 1) * per_learner))
                   for m in range(in_use // per_learner)} if per_learner > 1 else {}
    self._repairing: set[int] = set()  # slices that failed and are not back yet
    self._crashed: set[int] = set()  # slices whose device program failed during the run
    self._held: dict[int, int] = {}  # learner -> repaired slice kept for it until its reports settle

  def take_spare(self) -> int | None:
    """The oldest spare slice, or None."""
    return self._spares.pop(0) if self._spares else None

  def wait(self, learner: int, first: bool = False) -> None:
    """The learner waits for the next repaired slice (at the head of the queue if `first`)."""
    self._held.pop(learner, None)
    self._waiting.insert(0 if first else len(self._waiting), learner)

  def hold(self, learner: int, slice_index: int) -> None:
    """Keeps the slice for the learner, whose rejoin waits for its last report's verdict."""
    self._held[learner] = slice_index

  def release(self, learner: int) -> None:
    self._held.pop(learner, None)

  def held(self) -> list[tuple[int, int]]:
    """(learner, slice) of every held slice, by learner."""
    return sorted(self._held.items())

  def is_repairing(self, slice_index: int) -> bool:
    return slice_index in self._repairing

  def crashed(self, slice_index: int) -> None:
    """A learner's program failed with its slice; the slice goes into repair."""
    self.program_failed_on(slice_index)
    self._repairing.add(slice_index)

  def program_failed_on(self, slice_index: int) -> None:
    """A failed program ran on the slice: its devices are settled at the run's end (injection.settle)."""
    self._crashed.add(slice_index)

  def failed_idle(self, slice_index: int) -> None:
    """A slice no learner was training on failed: a spare is lost for the repair, and a learner it
    was held for goes back to the head of the queue."""
    holder = next((m for m, s in self._held.items() if s == slice_index), None)
    if holder is not None:
      self.wait(holder, first=True)
    if slice_index in self._spares:
      self._spares.remove(slice_index)
    self._repairing.add(slice_index)

  def repaired(self, slice_index: int) -> int | None:
    """The slice is back (repaired, or left healthy by a stopped learner): the learner that gets it, or None (it
    becomes a spare)."""
    self._repairing.discard(slice_index)
    if self._waiting:
      return self._waiting.pop(0)
    self._spares.append(slice_index)
    return None

  def begin_repair(self, slice_index: int) -> None:
    """A slice outside the pool (lent) is in repair."""
    self._repairing.add(slice_index)

  def end_repair(self, slice_index: int) -> None:
    """A slice outside the pool (lent) is back; it is not the pool's to give."""
    self._repairing.discard(slice_index)

  def owner(self, slice_index: int) -> int | None:
    """The learner of several slices that holds the slice, or None."""
    return next((m for m, owned in self._owned.items() if slice_index in owned), None)

  def owned(self, learner: int) -> list[int]:
    """The healthy slices the learner of several slices holds, ascending."""
    return list(self._owned.get(learner, ()))

  def give(self, learner: int, slice_index: int) -> None:
    self._owned[learner] = sorted(self._owned.get(learner, []) + [slice_index])

  def take_back(self, learner: int, slice_index: int) -> None:
    self._owned[learner].remove(slice_index)

  def forget(self, learner: int) -> None:
    """The learner stopped for good: it waits for no slice any more."""
    self._waiting = [m for m in self._waiting if m != learner]

  def snapshot(self) -> dict:
    return dict(spares=self._spares, waiting=self._waiting, repairing=sorted(self._repairing),
                crashed=sorted(self._crashed), held=sorted(self._held.items()), owned=sorted(self._owned.items()))

  def restore(self, saved: dict) -> None:
    self._spares, self._waiting = list(saved["spares"]), list(saved["waiting"])
    self._repairing, self._crashed = set(saved["repairing"]), set(saved["crashed"])
    self._held = {m: s for m, s in saved["held"]}
    self._owned = {m: list(owned) for m, owned in saved["owned"]}

  def take_crashed(self) -> list[int]:
    """The slices whose programs failed, sorted, forgotten once taken."""
    crashed, self._crashed = sorted(self._crashed), set()
    return crashed
