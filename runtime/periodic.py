"""When a periodic action (eval, log, checkpoint) is due: the one "is it time?" helper every loop asks.

Three shapes, each exactly what its callers need (big_vision's `itstime`, levanter's hooks with `every=N`):
- `due(step, every, last)`: every `every`-th step, and once more at the last step;
- `Marks`: a growing count (tokens) reaching the next of marks `every` apart;
- `SinceLast`: at least `every` counts or `seconds` of the run's clock since the action last ran.
"""

import dataclasses


def due(step: int, every: int, last: int | None = None) -> bool:
  """Whether the action runs after `step` (counted from 1): at every multiple of `every` (>= 1), and at `last`."""
  return step % every == 0 or step == last


@dataclasses.dataclass
class Marks:
  """Marks `every` apart on a growing count (tokens); the action is due once the count reaches the next one."""

  every: int
  next: int = dataclasses.field(init=False)  # the next mark (saved and restored with the run's tallies)

  def __post_init__(self):
    self.next = self.every

  def reached(self, count: int) -> bool:
    """Whether `count` has reached the next mark."""
    return count >= self.next

  def advance(self) -> None:
    """The next mark, one interval on (for counts that never pass two marks at once)."""
    self.next += self.every

  def advance_past(self, count: int) -> None:
    """The first mark above `count`: marks the count jumped over are skipped, not owed."""
    while self.next <= count:
      self.next += self.every


@dataclasses.dataclass
class SinceLast:
  """Due when at least `every` counts (merges) or `seconds` have passed since `done`; 0 turns either measure off."""

  every: int = 0
  seconds: float = 0.0
  count: int = 0  # the count when the action last ran
  at: float = 0.0  # the clock's time then

  def due(self, count: int, now: float) -> bool:
    """Whether enough counts or enough time have passed since the action last ran."""
    return bool((self.every and count - self.count >= self.every) or (self.seconds and now - self.at >= self.seconds))

  def done(self, count: int, now: float) -> None:
    """The action ran at `count`, at `now`: the next one is measured from here."""
    self.count, self.at = count, now
