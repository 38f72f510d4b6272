"""The data service: disjoint leases of one global stream, given-back windows served first, resumable."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from runtime.data import shards as data_lib
from runtime.data.service import DataService, LeasedStream
from runtime.errors import DataError
from runtime.data.staging import Stager

SEQ = 7


def _tokens(n: int = 2000) -> np.ndarray:
  return np.arange(n, dtype=np.int32) % 251


def test_a_lease_names_windows_of_the_stream_in_seeded_epoch_order():
  service = DataService(_tokens(), seq_len=SEQ, seed=3)
  windows = _tokens()[:2000 // (SEQ + 1) * (SEQ + 1)].reshape(-1, SEQ + 1)
  serials = service.lease(2 * len(windows))  # two whole epochs
  got = service.windows(serials)
  first, second = got[:len(windows)], got[len(windows):]
  # Each epoch visits every window exactly once, in a different seeded order.
  assert sorted(map(tuple, first)) == sorted(map(tuple, windows)) == sorted(map(tuple, second))
  assert not np.array_equal(first, second)
  again = DataService(_tokens(), seq_len=SEQ, seed=3)
  np.testing.assert_array_equal(again.windows(again.lease(len(serials))), got)  # same seed, same stream
  other = DataService(_tokens(), seq_len=SEQ, seed=4)
  assert not np.array_equal(other.windows(other.lease(len(windows))), first)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["lease", "give"]), st.integers(0, 9)), max_size=30))
def test_serials_are_never_handed_to_two_holders_and_none_is_lost(ops):
  service = DataService(_tokens(), seq_len=SEQ, seed=0)
  holders: list[list[int]] = [[], [], []]
  for i, (op, n) in enumerate(ops):
    held = holders[i % 3]
    if op == "lease":
      held.extend(service.lease(n).tolist())
    else:  # a holder gives back its last n serials
      cut = max(len(held) - n, 0)
      service.give_back(np.asarray(held[cut:], np.int64))
      del held[cut:]
  everything = [s for h in holders for s in h] + service.returned
  assert sorted(everything) == list(range(service.frontier))


def test_given_back_serials_are_served_first_in_order():
  service = DataService(_tokens(), seq_len=SEQ, seed=0)
  a = service.lease(5)
  service.give_back(a[2:])
  np.testing.assert_array_equal(service.lease(4), [2, 3, 4, 5])
  assert service.frontier == 6
  saved = service.snapshot()
  service.lease(3)
  service.restore(saved)
  np.testing.assert_array_equal(service.lease(2), [6, 7])


def test_a_leased_stream_serves_only_leased_batches_and_gives_back_what_it_never_trains():
  service = DataService(_tokens(), seq_len=SEQ, seed=0)
  stream = LeasedStream(service, batch_size=3, learner=0)
  with pytest.raises(DataError, match="not leased"):
    stream.batch_at(0)
  stream.lease_through(2)
  np.testing.assert_array_equal(stream.serials(0, 2), range(6))
  np.testing.assert_array_equal(next(stream), service.windows(np.arange(3)))
  stream.give_back_from(1)
  assert stream.leased == 1 and service.returned == [3, 4, 5]
  other = LeasedStream(service, batch_size=2, learner=1)
  other.lease_through(2)
  np.testing.assert_array_equal(other.serials(0, 2), [3, 4, 5, 6])


def test_the_prefetcher_waits_for_leases_and_stops_while_waiting():
  service = DataService(_tokens(), seq_len=SEQ, seed=0)
  stream = LeasedStream(service, batch_size=2, learner=0)
  prefetcher = data_lib.Prefetcher(stream, depth=2)
  got = []
  reader = threading.Thread(target=lambda: got.append(next(prefetcher)))
  reader.start()
  reader.join(0.3)
  assert reader.is_alive() and not got  # nothing leased: the producer waits, it does not fail
  stream.lease_through(1)
  reader.join(5)
  np.testing.assert_array_equal(got[0], service.windows(np.arange(2)))
  prefetcher.close()  # the producer waits for batch 1 (not leased): closing must not hang


def _leased_stager():
  """A stager of learner 0's leased stream (nothing leased yet), and the sharding it stages onto."""
  import jax  # pylint: disable=g-import-not-at-top
  service = DataService(_tokens(), seq_len=SEQ, seed=0)
  stream = LeasedStream(service, batch_size=2, learner=0)
  return service, stream, Stager(stream, 2, "test"), jax.sharding.SingleDeviceSharding(jax.devices()[0])


def test_a_stager_on_a_leased_stream_serves_each_lease_once_across_restores():
  service, stream, stager, sharding = _leased_stager()
  stream.lease_through(4)
  first = stager.take(2, sharding)
  stager.stage_ahead(2, sharding)
  stream.give_back_from(2)  # the learner leaves: what was staged ahead is dropped
  stager.restore(first.end)
  stream.lease_through(3)  # the next lease serves the given-back serials again
  np.testing.assert_array_equal(stream.serials(2, 3), [4, 5])
  again = stager.take(1, sharding)
  np.testing.assert_array_equal(np.asarray(again.batches_HxBxT)[0], service.windows(np.array([4, 5])))
  stager.close()


def test_a_stager_waiting_for_batches_never_leased_is_interrupted_when_they_are_dropped():
  """Regression (a hang of the default suite): the part staged ahead waited for batches not leased yet; the learner
  gave its leases back and restored its position, and the restore waited for that staging forever."""
  service, stream, stager, sharding = _leased_stager()
  stream.lease_through(2)
  first = stager.take(2, sharding)
  stager.stage_ahead(2, sharding)  # batches 2 and 3: not leased, so the staging waits
  stream.give_back_from(2)
  restoring = threading.Thread(target=stager.restore, args=(first.end,), daemon=True)
  restoring.start()
  restoring.join(5)
  assert not restoring.is_alive(), "the restore waited for a staging that could never finish"
  stream.lease_through(3)
  again = stager.take(1, sharding)
  np.testing.assert_array_equal(np.asarray(again.batches_HxBxT)[0], service.windows(stream.serials(2, 3)))
  stager.close()
