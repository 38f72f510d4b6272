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
