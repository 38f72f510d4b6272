"""Snapshots of the controller's state: an array shared by several objects is stored once, and the same arrays
unpacked for two placements are two trees, each where its caller put it."""

import jax
import jax.numpy as jnp
import numpy as np

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.cluster import devices as devices_lib
from runtime.diloco.sync.messages import CODECS, Report


def test_shared_arrays_are_stored_once_and_unpacked_once_per_placement():
  theta = {"b": jnp.zeros(2), "w": jnp.arange(3.0)}
  treedefs = {"params": jax.tree.structure(theta)}
  packer = snapshot_lib.Packer((), treedefs, CODECS)
  saved = packer.tree(theta, "params")
  report = packer.value(Report(0, theta, 64, 2, 0, loss=1.0, sent_at=0.5))
  assert len(packer.groups[snapshot_lib.HOST]) == 2  # Θ and the report's θ are one set of arrays
  arrays, failed = snapshot_lib.fetch(packer.groups)
  host = devices_lib.host_device()
  device = next(d for d in jax.devices() if d != host)
  unpacker = snapshot_lib.Unpacker(arrays, failed, (), treedefs, jax.sharding.SingleDeviceSharding(host), CODECS)
  on_host = unpacker.tree(saved)
  assert unpacker.value(report).params is on_host  # one tree, as before the snapshot
  placed = unpacker.tree(saved, lambda x, _: jax.device_put(x, device), where="learner 1")
  assert placed is not on_host
  assert {d for x in jax.tree.leaves(placed) for d in x.devices()} == {device}
  assert {d for x in jax.tree.leaves(on_host) for d in x.devices()} == {host}
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(placed), jax.device_get(theta))


def test_a_part_packed_elsewhere_is_taken_in_under_its_own_keys_and_its_failed_group_kept():
  # A learner in another process packs its part with a packer of its own (keys a0, a1, ... like the controller's);
  # the controller's packer takes it in under a prefix, and the arrays it names come back out for its restore there.
  theta = {"b": jnp.zeros(2), "w": jnp.arange(3.0)}
  treedefs = {"params": jax.tree.structure(theta)}
  elsewhere = snapshot_lib.Packer((), treedefs, CODECS)
  part = dict(state=elsewhere.tree(jax.tree.map(lambda x: x + 1, theta), "params", "learner1"),
              inbox=elsewhere.value(Report(1, theta, 64, 2, 0, loss=1.0, sent_at=0.5)), round=3)
  arrays, _ = snapshot_lib.fetch(elsewhere.groups)
  failed = {"learner1": "JaxRuntimeError: SliceCrash: its program failed"}  # (its state's arrays never came)
  arrays = {k: a for k, a in arrays.items() if k not in elsewhere.groups["learner1"]}
  packer = snapshot_lib.Packer((), treedefs, CODECS)
  mine = packer.tree(theta, "params")
  taken = packer.fetched(part, arrays, failed, prefix="learner1:")
  assert mine["keys"] == ["a0", "a1"] and taken["state"]["keys"] == ["learner1:a0", "learner1:a1"]
  assert taken["inbox"]["report"]["params"]["keys"] == ["learner1:a2", "learner1:a3"] and taken["round"] == 3
  assert packer.failed == failed
  fetched, _ = snapshot_lib.fetch(packer.groups)
  unpacker = snapshot_lib.Unpacker(fetched, packer.failed, (), treedefs,
                                   jax.sharding.SingleDeviceSharding(devices_lib.host_device()), CODECS)
  named = unpacker.arrays_named(taken)
  assert sorted(named) == ["learner1:a2", "learner1:a3"]  # the failed group's are none
  there = snapshot_lib.Unpacker(named, unpacker.failed, (), treedefs,
                                jax.sharding.SingleDeviceSharding(devices_lib.host_device()), CODECS)
  assert there.failed["learner1"].startswith("JaxRuntimeError")
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(there.value(taken["inbox"]).params), theta)
