"""What learners and the syncer send each other: a Report up, a Delivery of Θ down, and how checkpoints save them."""

import dataclasses
from typing import Any

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.config.fragment_plan import WHOLE
from runtime.wire import payload as payload_lib

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Report:
  """One learner's progress since it last received Θ."""

  learner: int
  params: PyTree  # θ_m, already on the host (None when `payload` carries the outer gradient instead)
  tokens: int  # c_tokens since the learner last received Θ
  steps: int  # c_steps since the learner last received Θ
  base_version: int  # the outer step of the Θ the learner started from
  loss: float
  sent_at: float
  data_start: dict = dataclasses.field(default_factory=dict)  # the learner's data position range
  data_end: dict = dataclasses.field(default_factory=dict)  # ... that this report trained on
  busy_seconds: float = 0.0  # slice time spent on this report's inner steps
  round: int = 0  # the learner's round it closes
  total_steps: int = 0  # the learner's inner steps ever trained at the report: where its inner schedule stands
  payload: Any = None  # compression.up != "none": Δ_m = Θ_base − θ_m compressed (a wire.payload.Payload)
  base_mirror: int = -1  # compression.down != "none": the syncer's mirror Θ̃_m it started from (-1: Θ_base whole)
  # fragments > 1: the fragment whose tensors `params` holds (base_version is that fragment's), and the tokens and
  # steps that fragment trained on since the learner last received it (-1: tokens and steps, as with one fragment)
  fragment: int = 0
  fragment_tokens: int = -1
  fragment_steps: int = -1

  def trained(self) -> tuple[int, int]:
    """Tokens and inner steps behind its outer gradient (its merge weight): since its fragment was received."""
    return (self.tokens, self.steps) if self.fragment_tokens < 0 else (self.fragment_tokens, self.fragment_steps)


@dataclasses.dataclass(frozen=True)
class Delivery:
  """Θ on its way to a learner, and how to adopt it."""

  version: int
  params: PyTree
  round: int  # the learner's round this answers; a learner that moved on ignores it
  reset: bool = False  # fresh inner state (rejoin, quarantined report)
  rewind_to: dict | None = None  # serve the data from here again (its earlier work never reached Θ)
  payload: Any = None  # compression.down != "none": Θ − Θ̃ compressed (params is None), see wire/downlink.py
  base: tuple[int, int] = (-1, 0)  # ... the (mirror, version) of the Θ̃ it updates,
  mirror: int = -1  # ... and the number of the mirror it makes
  fragment: int = WHOLE  # fragments > 1: the fragment whose tensors `params` holds (WHOLE: all of Θ)
  # `params` already laid out where the learner trains, by the landing it gave the merge worker (opaque here, see
  # runtime/diloco/learner/interface.py); never checkpointed (a resumed learner copies `params` itself)
  placed: tuple[Any, PyTree] | None = dataclasses.field(default=None, compare=False, repr=False)


def _pack(packer: snapshot_lib.Packer, message: Report | Delivery) -> dict:
  trees = dict(params=lambda v: packer.tree(v, "params"), payload=lambda v: payload_lib.snapshot(packer, v))
  return {f.name: trees.get(f.name, lambda v: v)(getattr(message, f.name)) for f in dataclasses.fields(message)
          if f.name != "placed"}  # (Θ already on a learner's slices: a resumed learner places it again)


def _unpack(kind: type, unpacker: snapshot_lib.Unpacker, body: dict) -> Report | Delivery:
  fields = dict(body, params=unpacker.tree(body["params"]), payload=payload_lib.restored(unpacker, body.get("payload")))
  if kind is Delivery:
    fields["base"] = tuple(fields.get("base", (-1, 0)))
  return kind(**fields)


# How checkpoints save the messages (runtime/checkpoint/snapshot.py): reports and deliveries under their own tags.
CODECS = tuple(snapshot_lib.Codec(kind, tag, _pack, lambda unpacker, body, kind=kind: _unpack(kind, unpacker, body))
               for kind, tag in ((Report, "report"), (Delivery, "delivery")))
