"""Moving averages and availability accounting."""


class Ema:
  """Exponential moving average; 0 until the first update."""

  def __init__(self, decay: float):
    self.decay = decay
    self.value = 0.0
    self._seen = False

  def update(self, x: float) -> float:
    self.value = x if not self._seen else self.decay * self.value + (1 - self.decay) * x
    self._seen = True
    return self.value


class Ledger:
  """Chip-time accounting: goodput = slice time whose work reached Θ / slice time allocated."""

  def __init__(self, num_slices: int, chips_per_slice: int):
    self.num_slices = num_slices
    self.chips_per_slice = chips_per_slice
    self.useful_seconds = 0.0  # slice-seconds of merged work
    self.lost_seconds = 0.0  # slice-seconds of work that crashed, was dropped or quarantined

  def useful(self, slice_seconds: float) -> None:
    self.useful_seconds += slice_seconds

  def lost(self, slice_seconds: float) -> None:
    self.lost_seconds += slice_seconds

  def goodput(self, elapsed: float) -> float:
    """Useful chip-time over allocated chip-time (every slice, spares included, for `elapsed`)."""
    return self.useful_seconds / (self.num_slices * elapsed) if elapsed > 0 else 0.0
