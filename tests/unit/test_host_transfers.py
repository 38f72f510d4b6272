"""The pinned route of reports and Θ (runtime/train/tree_transfer.py): a report is one transfer into its device's
pinned host memory that the syncer reads in place; Θ is packed once per merge for every learner it goes to. CPU
devices have pinned host memory too: asked for by name, it is the route these tests take (on an accelerator, the
default's). And the copy route's large leaves, copied one by one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import SingleDeviceSharding

from runtime.config.run import from_config_dict
from runtime.errors import ConfigError
from runtime.train import tree_transfer


def _tree(device):
  """Leaves of awkward sizes (none a multiple of the alignment), on `device`."""
  rng = np.random.default_rng(0)
  return jax.device_put({"w": rng.normal(size=(37, 3)).astype(np.float32), "b": rng.normal(size=(5,)).astype(
      np.float32), "s": np.float32(2.5)}, device)


def _equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))


@pytest.fixture
def counted(monkeypatch):
  """Every jax.device_put (anyone's: the module is jax's) and packing program tree_transfer makes, counted."""
  calls = {"device_put": [], "pack": 0, "host_pack": 0}
  put, pack, host_pack = jax.device_put, tree_transfer._pack, tree_transfer._pack_on_host

  def counting_put(x, *args, **kwargs):
    calls["device_put"].append(len(jax.tree.leaves(x)))
    return put(x, *args, **kwargs)

  def counting_pack(leaves):
    calls["pack"] += 1
    return pack(leaves)

  def counting_host_pack(leaves):
    calls["host_pack"] += 1
    return host_pack(leaves)

  monkeypatch.setattr(tree_transfer.jax, "device_put", counting_put)
  monkeypatch.setattr(tree_transfer, "_pack", counting_pack)
  monkeypatch.setattr(tree_transfer, "_pack_on_host", counting_host_pack)
  return calls


def test_the_pinned_route_is_taken_where_the_devices_have_pinned_host_memory_and_auto_keeps_cpus_on_copies():
  assert "pinned_host" in {m.kind for m in jax.devices()[0].addressable_memories()}
  assert tree_transfer.route("pinned") == "pinned"
  assert tree_transfer.route("copy") == "copy"
  assert tree_transfer.route("auto") == "copy"  # (CPU devices: their own copies are faster)


def _big(device):
  """Leaves of more than ADOPT_BYTES each, of sizes no multiple of the alignment."""
  rng = np.random.default_rng(1)
  return jax.device_put({"w": rng.normal(size=(130, 131)).astype(np.float32),
                         "v": rng.normal(size=(16_411,)).astype(np.float32)}, device)


@pytest.mark.parametrize("make, adopted", [(_big, True), (_tree, False)], ids=["large_leaves", "small_leaves"])
def test_a_report_is_one_transfer_into_its_devices_pinned_host_memory_and_lands_in_one_call(counted, make, adopted):
  """Large leaves are adopted in place; small ones (adopting each costs more than copying it) are unpacked by one
  program from the buffer adopted whole."""
  learner, host = jax.devices()[1], SingleDeviceSharding(jax.devices()[0])
  tree = make(learner)
  counted["device_put"].clear()
  staged = tree_transfer.stage(tree)
  assert isinstance(staged, tree_transfer.Staged)
  assert staged.flat.sharding.memory_kind == "pinned_host" and staged.flat.sharding.device_set == {learner}
  assert counted["device_put"] == []  # one program writes the packed leaves there: no transfer per leaf
  assert tree_transfer.unstaged(staged) is tree  # (what a checkpoint fetches: nothing waits for the transfer)
  landed = tree_transfer.copy_to(staged, host)
  leaves = jax.tree.leaves(tree)
  assert counted["device_put"] == [len(leaves) if adopted else 1]  # one call: the leaves' views, or the buffer
  _equal(landed, tree)
  whole = np.from_dlpack(staged.flat)
  for x in jax.tree.leaves(landed):
    assert x.sharding.device_set == set(host.device_set)
    assert np.shares_memory(np.asarray(x), whole) == adopted  # no host copy between the transfer and the merge
    assert not adopted or x.unsafe_buffer_pointer() % tree_transfer.ALIGN_BYTES == 0


@pytest.mark.parametrize("fault", ["raises", "changes_the_bits"])
def test_where_the_pinned_routes_probe_fails_the_copy_route_serves(monkeypatch, fault):
  if fault == "raises":
    monkeypatch.setattr(tree_transfer, "stage", lambda tree: 1 / 0)
  else:
    send = tree_transfer.send
    monkeypatch.setattr(tree_transfer, "send", lambda *args: jax.tree.map(lambda x: x + 1, send(*args)))
  assert tree_transfer.route.__wrapped__("pinned") == "copy"
  monkeypatch.undo()
  assert tree_transfer.route.__wrapped__("pinned") == "pinned"


def test_a_tree_the_route_cannot_stage_stays_as_it_is():
  two = jax.devices()[:2]
  mixed = {"a": jnp.ones(3, jnp.float32), "b": jnp.ones(3, jnp.int32)}
  spread = {"a": jax.device_put(jnp.ones(3), two[0]), "b": jax.device_put(jnp.ones(3), two[1])}
  for tree in (mixed, spread):
    assert tree_transfer.stage(tree) is tree


def test_theta_is_packed_once_per_merge_and_sent_as_one_transfer_to_each_learner(counted):
  theta = _tree(jax.devices()[0])
  counted["device_put"].clear()
  shared = tree_transfer.Shared(theta)
  learners = [SingleDeviceSharding(d) for d in jax.devices()[1:4]]
  laid_out = [tree_transfer.copy_to(shared, s) for s in learners]
  assert counted["host_pack"] == 1 and counted["pack"] == 0  # one buffer, packed on the host, sent to all three
  assert counted["device_put"] == [1, 1, 1]  # the packed buffer, once per learner
  for tree, s in zip(laid_out, learners):
    _equal(tree, theta)
    assert all(x.sharding.device_set == s.device_set for x in jax.tree.leaves(tree))
    assert not any(np.shares_memory(np.asarray(x), np.asarray(y)) for x in jax.tree.leaves(tree)
                   for y in jax.tree.leaves(theta))


@pytest.mark.parametrize("source", [1, 0], ids=["another_device", "the_same_device"])
def test_large_leaves_between_devices_of_one_platform_are_copied_one_by_one_not_packed(counted, source):
  tree = _big(jax.devices()[source])
  counted["device_put"].clear()
  copied = tree_transfer.copy_to(tree, SingleDeviceSharding(jax.devices()[0]))
  assert counted == {"device_put": [2], "pack": 0, "host_pack": 0}  # one call, each leaf one copy
  _equal(copied, tree)
  for x, y in zip(jax.tree.leaves(copied), jax.tree.leaves(tree)):
    assert x.sharding.device_set == {jax.devices()[0]} and not np.shares_memory(np.asarray(x), np.asarray(y))
  assert tree_transfer.leafwise(tree, SingleDeviceSharding(jax.devices()[0]))
  assert not tree_transfer.leafwise(_tree(jax.devices()[source]), SingleDeviceSharding(jax.devices()[0]))


def test_host_transfers_is_checked_by_name(tiny_config):
  tiny_config.host_transfers = "dma"
  with pytest.raises(ConfigError, match="host_transfers.*'auto', 'pinned', 'copy'"):
    from_config_dict(tiny_config)
