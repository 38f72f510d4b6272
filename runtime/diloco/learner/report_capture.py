"""A learner's report taken on its slice before the part after it is enqueued, and sent when its part has finished.

The part queued behind a report's part donates the state they share, so the report's tensors are taken first: a
fresh copy on the slice (or quantized there), made by the main part itself where it can, or no copy at all when no
part is queued behind it. Nothing waits: the merge worker copies them to the host, or (the pinned route) their
copy into the device's pinned host memory starts as they are taken and the merge worker reads it there.
"""

from typing import Any

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.faults import injection
from runtime.train import tree_transfer
from runtime.wire import payload as payload_lib
from runtime.wire.payload import Payload
from runtime.wire.uplink import Uplink

PyTree = Any


class ReportCapture:
  """At most one report taken and not yet sent: its fault injection, its tensors or its quantized parts."""

  def __init__(self, uplink: Uplink | None, fragments: int, stage: bool = False):
    self._uplink = uplink
    self._stage = stage  # its tensors' copy to the host started as they are taken (tree_transfer.stage)
    self.by_part = uplink is None and fragments == 1  # with overlap steps, a main part copies a whole report itself
    self._taken: tuple[str, PyTree, Any] | None = None  # (corruption, params, quantized parts or payload)
    self._held: tuple[Any, PyTree] | None = None  # (the state a main part ended in, its copy of their parameters)

  def hold(self, state: Any, copied: list[PyTree]) -> None:
    """The part just enqueued ends in `state`; `copied`: its own copy of their parameters, if it made one (the
    report's tensors, if taken from that state)."""
    self._held = (state, copied[0]) if copied else None

  def take(self, local: PyTree, corrupt: str, state: Any = None, copy: bool = True) -> PyTree | None:
    """Enqueues the copy (or the quantizing) of θ_m's tensors `local` of `state`, or takes the copy its part made;
    `corrupt` injects a fault into them. Returns the clean copy (None if quantized), which nothing donates. Without
    `copy` (no overlap steps: nothing donates them before Θ replaces them) the report is `local` itself."""
    held, self._held = self._held, None
    parts = self._uplink.quantize(local, corrupt) if self._uplink else None
    clean = None
    if parts is None and not copy:
      clean = local
    elif parts is None:
      clean = held[1] if held is not None and held[0] is state else tree_transfer.fresh_copy(local)
    sent = injection.corrupt(clean, corrupt) if corrupt and clean is not None else clean
    self._taken = (corrupt, tree_transfer.stage(sent) if self._stage and sent is not None else sent, parts)
    return clean

  @property
  def taken(self) -> bool:
    return self._taken is not None

  def send(self) -> tuple[PyTree, Payload | None]:
    """The report's tensors (on the slice, or Staged in its device's pinned host memory) and its payload (waiting
    for the quantized parts); it is taken again next time."""
    (corrupt, params, parts), self._taken = self._taken, None
    return params, self._payload(parts, corrupt)

  def drop(self) -> None:
    self._taken = self._held = None

  def _payload(self, parts: Any, corrupt: str) -> Payload | None:
    return parts if parts is None or isinstance(parts, Payload) else self._uplink.pack(parts, corrupt)

  def snapshot(self, packer: snapshot_lib.Packer, group: str) -> dict | None:
    """The report taken, its tensors in `group`.captured (its payload packed: a checkpoint awaits its part)."""
    if self._taken is None:
      return None
    corrupt, params, parts = self._taken
    return dict(how=corrupt, params=packer.tree(params, "params", f"{group}.captured"),
                payload=payload_lib.snapshot(packer, self._payload(parts, corrupt)))

  def restore(self, saved: dict | None, unpacker: snapshot_lib.Unpacker, group: str) -> None:
    self._taken = None if saved is None else (
        saved["how"], unpacker.tree(saved["params"], where=f"{group}.captured"), payload_lib.restored(unpacker, saved["payload"]))
