"""A learner's part in flight in its checkpoint: the part (its figures, its metrics) and what it started from.

The part's train state is the learner's own (saved with it); a learner that reconfigures also keeps the state and
data position before the part, to go back to if one of its slices fails.
"""

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.diloco.sync.messages import RoundPart
from runtime.train.programs import TrainState


def pack_part(part: RoundPart | None, packer: snapshot_lib.Packer, group: str) -> dict | None:
  """The part's figures, its metrics' arrays in `group`."""
  if part is None:
    return None
  return dict(kind=part.kind, steps=part.steps, tokens=part.tokens, started_at=part.started_at,
              modeled_seconds=part.modeled_seconds, metrics=packer.tree(part.metrics, "dict", group),
              failure=part.failure)


def unpack_part(saved: dict | None, unpacker: snapshot_lib.Unpacker, group: str, state: TrainState | None,
                mesh: jax.sharding.Mesh, failure: str) -> RoundPart | None:
  """The part `pack_part` saved, producing `state`, its metrics replicated on `mesh` (none once it failed: its
  error, or the `failure` of its group's arrays)."""
  if saved is None:
    return None
  replicated = NamedSharding(mesh, P())
  failure = saved["failure"] or failure
  metrics = None if failure else unpacker.tree(saved["metrics"], lambda x, _: jax.device_put(x, replicated), group)
  return RoundPart(saved["kind"], saved["steps"], saved["tokens"], saved["started_at"], saved["modeled_seconds"],
                   state, metrics, failure=failure)


def pack_before(before: tuple[TrainState, dict] | None, packer: snapshot_lib.Packer, group: str) -> dict | None:
  """The state and data position before the part, the state's arrays in `group`.before."""
  return None if before is None else dict(state=packer.tree(before[0], "train", f"{group}.before"), data=before[1])


def unpack_before(saved: dict | None, unpacker: snapshot_lib.Unpacker, group: str,
                  like: Any) -> tuple[TrainState, dict] | None:
  """What `pack_before` saved, the state placed like the train state `like`."""
  if saved is None:
    return None
  return unpacker.tree(saved["state"], snapshot_lib.like(like), f"{group}.before"), saved["data"]
