"""The stager: a learner's next part is stacked and sent to its slice off the controller thread."""

import threading

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from runtime.data import shards as data_lib
from runtime.cluster import devices as devices_lib
from runtime.data.staging import Stager


@pytest.fixture
def stream():
  return data_lib.ShardIterator(np.arange(20_000, dtype=np.int32) % 251, batch_size=4, seq_len=7)


def _reference(stream_factory, parts):
  """The batches of consecutive parts, read straight from a fresh stream."""
  it = stream_factory()
  return [np.stack([next(it) for _ in range(steps)]) for steps in parts]


def _sharding(devices):
  return NamedSharding(devices_lib.slice_mesh(devices), P(None, "data"))


def test_the_part_staged_ahead_is_read_on_the_stager_thread_and_served_in_order(stream, monkeypatch):
  sharding = _sharding(jax.devices()[:2])
  readers = []
  real_stage = Stager._stage
  monkeypatch.setattr(Stager, "_stage", lambda self, *a: (readers.append(threading.current_thread().name),
                                                          real_stage(self, *a))[1])
  stager = Stager(stream, prefetch=2, name="0")
  first = stager.take(3, sharding)  # nothing staged yet: read here
  stager.stage_ahead(2, sharding)
  second = stager.take(2, sharding)  # picked up, read on the stager's thread
  stager.close()
  assert readers[0] == threading.current_thread().name and readers[1].startswith("stage-0")
  want = _reference(lambda: data_lib.ShardIterator(np.arange(20_000, dtype=np.int32) % 251, batch_size=4,
                                                   seq_len=7), [3, 2])
  np.testing.assert_array_equal(np.asarray(first.batches_HxBxT), want[0])
  np.testing.assert_array_equal(np.asarray(second.batches_HxBxT), want[1])
  assert (first.end, second.start) == (second.start, first.end) and second.end["position"] == 5
  assert second.tokens == 2 * 4 * 7


def test_a_part_unlike_the_one_staged_or_a_restore_serves_the_same_data_again(stream):
  sharding = _sharding(jax.devices()[:2])
  stager = Stager(stream, prefetch=2, name="0")
  stager.take(3, sharding)
  stager.stage_ahead(2, sharding)
  bigger = stager.take(4, sharding)  # asked for 4, 2 were staged: the stream resumes after the first part
  assert (bigger.start["position"], bigger.end["position"]) == (3, 7)
  stager.stage_ahead(2, sharding)
  moved = stager.take(2, _sharding(jax.devices()[2:4]))  # the learner moved slices: staged again there
  assert moved.start["position"] == 7 and moved.batches_HxBxT.sharding == _sharding(jax.devices()[2:4])
  stager.stage_ahead(2, sharding)
  stager.restore(bigger.start)
  again = stager.take(4, sharding)
  stager.close()
  np.testing.assert_array_equal(np.asarray(again.batches_HxBxT), np.asarray(bigger.batches_HxBxT))


def test_staging_ahead_twice_serves_the_untaken_part_again(stream):
  sharding = _sharding(jax.devices()[:2])
  stager = Stager(stream, prefetch=2, name="0")
  stager.stage_ahead(2, sharding)
  stager.stage_ahead(3, sharding)  # the first was never taken
  part = stager.take(3, sharding)
  stager.close()
  assert (part.start["position"], part.end["position"]) == (0, 3)
