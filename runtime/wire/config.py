"""How reports travel learner → syncer: the codec of the outer gradient, validated at the config boundary."""

import dataclasses
from typing import Any

from runtime.errors import check

FORMATS = ("none", "bf16", "int8", "int4", "topk")  # "none": θ_m whole in fp32, as reports always were
VALUE_FORMATS = ("fp32", "bf16", "int8", "int4")  # how top-k sends the values it keeps
PAYLOAD_CORRUPTIONS = ("flip", "truncate")  # corrupt faults of a compressed payload's bytes


@dataclasses.dataclass(frozen=True)
class CompressionConfig:
  """The codec of outer gradients on the wire, learner → syncer (Θ goes down whole, fp32)."""

  up: str = "none"
  block_size: int = 256  # int8/int4 (and top-k's int values): one fp32 scale per block of this many values
  topk_fraction: float = 0.01  # topk: each tensor sends ceil(fraction × size) values, the largest in magnitude
  topk_values: str = "bf16"  # topk: the kept values' format, one of VALUE_FORMATS
  error_feedback: bool = True  # what a lossy codec did not send is added to the learner's next outer gradient


def validate(run: Any) -> None:
  """Raises ConfigError on the first compression field outside what it allows."""
  c = run.compression
  check(c.up in FORMATS, "compression.up", c.up, f"one of {FORMATS}")
  check(c.block_size >= 1, "compression.block_size", c.block_size, "an integer >= 1")
  check(0 < c.topk_fraction <= 1, "compression.topk_fraction", c.topk_fraction, "a float in (0, 1]")
  check(c.topk_values in VALUE_FORMATS, "compression.topk_values", c.topk_values, f"one of {VALUE_FORMATS}")
  if c.up == "none":
    wants = [f.text for f in run.faults.schedule if f.kind == "corrupt" and f.how in PAYLOAD_CORRUPTIONS]
    check(not wants, "faults.schedule", "; ".join(wants), f"corrupt how=nan|inf|huge while compression.up is "
          f"'none' (how={'|'.join(PAYLOAD_CORRUPTIONS)} corrupt a compressed payload)")
    return
  check(run.mode in ("decoupled", "diloco_sync"), "compression.up", c.up,
        f"'none' in mode '{run.mode}' (compressed reports are DiLoCo's: modes decoupled, diloco_sync)")
  check(not (run.checkpoint_every or run.checkpoint_seconds), "compression.up", c.up,
        "'none' while checkpoint_every or checkpoint_seconds is set (a learner's residual is not saved yet)")
