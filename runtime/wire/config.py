"""How reports travel learner → syncer (the codec of the outer gradient) and Θ syncer → learner (the codec of its
update), validated at the config boundary."""

import dataclasses
from typing import Any

from runtime.errors import check

FORMATS = ("none", "bf16", "int8", "int4", "topk")  # "none": θ_m whole in fp32, as reports always were
DOWN_FORMATS = FORMATS  # "none": Θ whole in fp32, as it always went down; topk: with topk_fraction, topk_values
VALUE_FORMATS = ("fp32", "bf16", "int8", "int4")  # how top-k sends the values it keeps
PAYLOAD_CORRUPTIONS = ("flip", "truncate")  # corrupt faults of a compressed payload's bytes


@dataclasses.dataclass(frozen=True)
class CompressionConfig:
  """The codecs on the wire: outer gradients learner → syncer (`up`), Θ's updates syncer → learner (`down`)."""

  up: str = "none"
  down: str = "none"  # Θ − Θ̃_m (what the learner holds) is sent in this format; Θ̃_m is then what it adopts
  block_size: int = 256  # int8/int4 (and top-k's int values): one fp32 scale per block of this many values
  topk_fraction: float = 0.01  # topk: each tensor sends ceil(fraction × size) values, the largest in magnitude
  topk_values: str = "bf16"  # topk: the kept values' format, one of VALUE_FORMATS
  error_feedback: bool = True  # what a lossy codec did not send is added to the learner's next outer gradient


def validate(run: Any) -> None:
  """Raises ConfigError on the first compression field outside what it allows."""
  c = run.compression
  check(c.up in FORMATS, "compression.up", c.up, f"one of {FORMATS}")
  check(c.down in DOWN_FORMATS, "compression.down", c.down, f"one of {DOWN_FORMATS}")
  check(c.block_size >= 1, "compression.block_size", c.block_size, "an integer >= 1")
  check(0 < c.topk_fraction <= 1, "compression.topk_fraction", c.topk_fraction, "a float in (0, 1]")
  check(c.topk_values in VALUE_FORMATS, "compression.topk_values", c.topk_values, f"one of {VALUE_FORMATS}")
  if c.down != "none":
    _check_supported(run, "compression.down", c.down)
  if c.up == "none":
    wants = [f.text for f in run.faults.schedule if f.kind == "corrupt" and f.how in PAYLOAD_CORRUPTIONS]
    check(not wants, "faults.schedule", "; ".join(wants), f"corrupt how=nan|inf|huge while compression.up is "
          f"'none' (how={'|'.join(PAYLOAD_CORRUPTIONS)} corrupt a compressed payload)")
    return
  _check_supported(run, "compression.up", c.up)


def _check_supported(run: Any, field: str, value: str) -> None:
  """Compression is DiLoCo's."""
  check(run.mode in ("decoupled", "diloco_sync"), field, value,
        f"'none' in mode '{run.mode}' (compressed transfers are DiLoCo's: modes decoupled, diloco_sync)")
