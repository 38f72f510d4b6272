"""The syncer in shards: Θ's tensors split across host CPU devices, each shard merging its share to the same bits as
one syncer holding them all."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from runtime.checkpoint import snapshot as snapshot_lib
from runtime.cluster import devices as devices_lib
from runtime.config.run import OuterConfig
from runtime.diloco.sync import averaging
from runtime.diloco.sync.messages import Report
from runtime.diloco.sync.shards import Shards
from runtime.diloco.sync.syncer import Syncer
from runtime.errors import ConfigError
from runtime.wire.config import CompressionConfig
from runtime.wire.downlink import Mirrors

SIZES = {"embed": (64, 16), "a": (16, 48), "b": (48, 16), "c": (16,), "d": (40, 16), "e": (7,)}


def _tree(seed: int, scale: float = 1.0) -> dict:
  rng = np.random.default_rng(seed)
  return {name: jnp.asarray(rng.standard_normal(shape, np.float32) * scale) for name, shape in SIZES.items()}


def _shards(num: int) -> Shards:
  host = [NamedSharding(devices_lib.slice_mesh([d]), P()) for d in devices_lib.host_devices(num)]
  return Shards(_tree(0), host)


def _devices(tree) -> set:
  return {d for x in jax.tree.leaves(tree) for d in x.devices()}


def test_a_norm_summed_from_each_shards_tensors_is_the_global_norm_bit_for_bit():
  shards, tree = _shards(4), _tree(1)
  sums = [jnp.stack([averaging.sum_of_squares(x) for x in jax.tree.leaves(part)]) for part in shards.parts(tree)]
  assert np.asarray(shards.norm(sums, tree)).tobytes() == np.asarray(averaging.global_norm(tree)).tobytes()


def test_shards_pack_whole_tensors_by_size_and_join_back():
  shards, tree = _shards(3), _tree(2)
  assert sorted(i for g in shards.groups for i in g) == list(range(len(SIZES)))
  largest = max(int(np.prod(s)) for s in SIZES.values()) * 4
  assert max(shards.nbytes) - min(shards.nbytes) <= largest
  joined = shards.join(shards.parts(tree))
  assert all(a is b for a, b in zip(jax.tree.leaves(joined), jax.tree.leaves(tree)))


@pytest.mark.parametrize("fragments,merge,down", [(1, "rda", "none"), (2, "mean", "none"), (1, "rda", "int4")])
def test_a_syncer_in_four_shards_merges_to_the_same_bits_as_one_and_keeps_each_tensor_on_its_shard(
    fragments, merge, down):
  cfg = OuterConfig(lr=0.7, momentum=0.9, merge=merge, quorum=1)
  syncers = []
  for num in (1, 4):
    shards = _shards(num)
    mirrors = Mirrors(CompressionConfig(down=down), _tree(0), shards) if down != "none" else None
    syncers.append(Syncer(cfg, shards.place(_tree(0)), num_learners=3, mirrors=mirrors, fragments=fragments,
                          shards=shards))
  one, four = syncers
  held = {}
  for n in range(6):  # learners 0, 1, 2 in turn, each from the Θ it was last sent (K = 1)
    m, fragment = n % 3, n % fragments
    results = []
    for syncer in syncers:
      mirror, version, base = held.get((id(syncer), m), (-1, 0, syncer.params))
      local = syncer.trees.part(jax.tree.map(lambda b, x: b - 0.01 * x, jax.device_get(base), _tree(10 + n)),
                                fragment)
      report = Report(m, local, 100 + n, 10, version, loss=1.0, sent_at=float(n), base_mirror=mirror,
                      fragment=fragment, fragment_tokens=100 + n if fragments > 1 else -1,
                      fragment_steps=10 if fragments > 1 else -1)
      result = syncer.compute([report], members=3)
      syncer.commit(result, [held.get((id(syncer), k), (-1, 0))[:2] for k in range(3)])
      answer = syncer.answer(report, "merged")
      syncer.adopted(m)
      if answer.payload is None:
        held[id(syncer), m] = (-1, answer.version, syncer.trees.put(base, answer.params, fragment)
                               if fragments > 1 else answer.params)
      else:
        held[id(syncer), m] = (answer.mirror, answer.version, syncer.mirrors.get(m, answer.mirror))
      results.append((result, answer))
    (a, answer_a), (b, answer_b) = results
    assert a.merged == b.merged == (m,) and a.update_norm == b.update_norm and a.delta_norms == b.delta_norms
    assert (answer_a.payload is None) == (answer_b.payload is None)
    if answer_a.payload is not None:  # Θ down: the same bytes, every tensor's parts in order
      assert answer_a.payload.blob == answer_b.payload.blob
  for x, y in zip(jax.tree.leaves(one.params), jax.tree.leaves(four.params), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  momentum_bytes = lambda state: sorted(np.asarray(x).tobytes() for x in jax.tree.leaves(state) if np.ndim(x))
  assert momentum_bytes(one.opt_state) == momentum_bytes(four.opt_state)  # (one state per shard, the same buffers)
  assert len(_devices(one.params)) == 1 and len(_devices(four.params)) == 4
  for s, part in enumerate(four.shards.parts(four.params)):  # Θ, the momentum and the mirrors on their shard
    device = four.shards.shardings[s].device_set
    assert all(x.devices() == device for x in jax.tree.leaves(part))
  momentum = four.opt_state if fragments == 1 else four.opt_state[0]
  assert all(_devices(state) <= four.shards.shardings[s].device_set for s, state in enumerate(momentum) if state)
  if down != "none":
    mirror = held[id(four), 2][2]
    assert all(x.devices() == y.devices() for x, y in zip(jax.tree.leaves(mirror), jax.tree.leaves(four.params)))


def test_a_sharded_syncer_restored_from_a_snapshot_of_another_number_of_shards_is_refused_naming_the_field():
  two = Syncer(OuterConfig(), _shards(2).place(_tree(0)), 2, shards=_shards(2))
  packer = snapshot_lib.Packer((), dict(params=jax.tree.structure(_tree(0)),
                                         outer=jax.tree.structure(two.opt_state)))
  saved = two.snapshot(packer)
  one = Syncer(OuterConfig(), _tree(0), 2)
  with pytest.raises(ConfigError, match=r"syncer.shards.*1.*2, as the checkpoint was saved"):
    one.restore(saved, unpacker=None)  # (refused before any tree is read)


def test_theta_in_shards_or_in_host_memory_reaches_a_learner_on_several_devices_as_its_own_copy():
  """A sharded syncer's Θ (tensors on four devices) and a learner's host copy of Θ (NumPy, compression down) both go
  onto a learner's two-device sharding: equal values, no buffer shared with the source."""
  from runtime.train import tree_transfer  # pylint: disable=g-import-not-at-top
  shards = _shards(4)
  learner = NamedSharding(devices_lib.slice_mesh(jax.devices("cpu")[4:6]), P())
  for source in (shards.place(_tree(3)), jax.device_get(_tree(3))):
    copied = tree_transfer.copy_to(source, learner)
    for x, y in zip(jax.tree.leaves(source), jax.tree.leaves(copied)):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
      assert y.sharding == learner and (not isinstance(x, jax.Array) or
                                        x.unsafe_buffer_pointer() != y.addressable_shards[0].data.unsafe_buffer_pointer())
