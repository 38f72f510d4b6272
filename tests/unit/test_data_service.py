"""The data service: disjoint leases of one global stream, given-back windows served first, resumable."""

import pickle
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


def test_a_stream_in_another_process_takes_exactly_the_leases_its_controller_granted():
  # backend "ray": the controller's stream leases from the service, the learner's copy (pickled to its process) takes
  # the same serials from the grant and serves the same windows; given-back leases leave the service from the
  # controller's copy only
  service = DataService(_tokens(), seq_len=SEQ, seed=5)
  other = LeasedStream(service, batch_size=2, learner=1)
  other.lease_through(1)  # (someone else's lease first: the service's frontier is not 0)
  here = LeasedStream(service, batch_size=2, learner=0)
  here.lease_through(1)
  there = pickle.loads(pickle.dumps(here.remote()))
  assert there.snapshot() == here.snapshot() and there.grants is not None and here.grants is None
  granted = here.lease_through(3)
  np.testing.assert_array_equal(granted, [4, 5, 6, 7])
  there.grants.grant(granted)
  np.testing.assert_array_equal(there.lease_through(3), granted)
  for position in range(3):
    np.testing.assert_array_equal(there.batch_at(position), here.batch_at(position))
  there.give_back_from(1)
  assert service.returned == []  # (the copy's give-back is the controller's to make)
  here.give_back_from(1)
  assert service.returned == [4, 5, 6, 7] and there.snapshot() == here.snapshot() == [2, 3]
  with pytest.raises(DataError, match="a lease of 4 serials where the controller granted 2"):
    there.grants.grant(np.array([2, 3]))
    there.lease_through(3)
