"""A learner's checkpoint: everything that decides its future, saved and restored (a mixin of `Learner`)."""

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from runtime.train import tree_transfer
from runtime.checkpoint import snapshot as snapshot_lib
from runtime.diloco.messages import RoundPart

PyTree = Any


class LearnerSnapshots:
  """Saves and restores the learner's bookkeeping, device state and the part it has in flight."""

  _SAVED = ("status", "tokens", "steps", "round", "base_version", "total_steps", "busy_seconds", "last_loss",
            "reports_out", "_unreported_busy", "_reported_tokens", "_reported_steps", "_round_start",
            "_reported_position", "_corrupt_next", "_finished_at", "_state_since", "_absent_seconds")

  def snapshot(self, packer: snapshot_lib.Packer) -> dict:
    """Everything that decides the learner's future; its device state is copied (the next round donates it)."""
    group = f"learner{self.index}"
    state = snapshot_lib.copied(self.state) if self.status not in self.STATE_LOST and self.state is not None else None
    part = self.inflight
    return dict(
        {name: getattr(self, name) for name in self._SAVED}, fragments=self.fragments.snapshot(),
        total_tokens=self.total_tokens, slice_index=self.slice_index, slices=list(self.slices),
        data=self._data.position, before=None if self._before_part is None else dict(
            state=packer.tree(self._before_part[0], "train", f"{group}.before"), data=self._before_part[1]),
        leases=None if self.leased is None else self.leased.snapshot(),
        completions=self.completions, intervals=self.intervals, state=packer.tree(state, "train", group),
        inbox=packer.value(self.inbox), at_report=packer.tree(self._at_report, "params", group),
        inflight=None if part is None else dict(
            kind=part.kind, steps=part.steps, tokens=part.tokens, started_at=part.started_at,
            modeled_seconds=part.modeled_seconds, metrics=packer.tree(part.metrics, "dict", group),
            failure=part.failure),
        uplink=self.uplink.snapshot(packer, group) if self.uplink and state is not None else None,  # else reset with Θ
        downlink=self.downlink.snapshot(packer, group) if self.downlink and state is not None else None)

  def restore(self, saved: dict, unpacker: snapshot_lib.Unpacker, theta_host: PyTree) -> None:
    """The learner as `snapshot` saw it (the controller has moved it to its slice first)."""
    for name in self._SAVED:
      setattr(self, name, saved[name])
    self.slices, self.slice_index = tuple(saved["slices"]), saved["slice_index"]
    self.total_tokens = saved.get("total_tokens", 0)  # (checkpoints from before fragments)
    self.fragments.bind(theta_host)
    self.fragments.restore(saved.get("fragments"))
    if self.leased is not None:
      self.leased.restore_leases(saved["leases"])
    self._data.restore(saved["data"])
    self.completions = [tuple(c) for c in saved["completions"]]
    self.intervals = [tuple(i) for i in saved["intervals"]]
    self.inbox = unpacker.value(saved["inbox"])
    group = f"learner{self.index}"
    failure = unpacker.failed.get(group, "")  # its program failed before the snapshot could copy its state
    self.state = self._at_report = self._before_part = None
    kept, before = saved["state"] is not None and not failure, saved["before"]
    like = self._init(tree_transfer.copy_to(theta_host, self.param_sharding), 0) if kept or before else None
    if kept:
      self.state = unpacker.tree(saved["state"], snapshot_lib.like(like), where=group)
      at_report = self.fragments.part(like.params, self.fragments.last())  # (its last report's fragment)
      self._at_report = unpacker.tree(saved["at_report"], snapshot_lib.like(at_report), where=group)
      if self.uplink:
        self.uplink.restore(saved.get("uplink"), unpacker, snapshot_lib.like(like.params), group)
      if self.downlink:
        self.downlink.restore(saved.get("downlink"), unpacker)
    if before is not None:  # the state before the part in flight (kept by a learner that reconfigures)
      self._before_part = (unpacker.tree(before["state"], snapshot_lib.like(like), f"{group}.before"), before["data"])
    part = saved["inflight"]
    if part is not None:
      replicated = NamedSharding(self.mesh, P())
      failure = part["failure"] or failure
      metrics = None if failure else unpacker.tree(part["metrics"], lambda x, _: jax.device_put(x, replicated), group)
      self.inflight = RoundPart(part["kind"], part["steps"], part["tokens"], part["started_at"],
                                part["modeled_seconds"], self.state, metrics, failure=failure)

