"""The clocks on their own: event order, cancellation, modeled durations."""

import concurrent.futures
import threading
import time

import jax
import numpy as np
import pytest

from runtime.diloco.clock import Event, EventKind, RealClock, VirtualClock
from runtime.config.run import ClockConfig


def _virtual(**cfg):
  return VirtualClock(ClockConfig(**cfg), num_learners=2, seed=0)


def test_virtual_events_pop_in_time_order_and_ties_in_scheduling_order():
  clock = _virtual()
  for name, delay in [("a", 1.0), ("b", 0.5), ("c", 1.0), ("d", 1.0), ("e", 0.5)]:
    clock.after(delay, Event(name))
  order = [clock.next_event() for _ in range(5)]
  assert [e.kind for _, e in order] == ["b", "e", "a", "c", "d"]
  assert [t for t, _ in order] == [0.5, 0.5, 1.0, 1.0, 1.0]
  assert clock.now() == 1.0
  for i in range(12):  # many ties: a random tie order would pass with probability 1/12!
    clock.after(1.0, Event(f"tie{i}"))
  assert [clock.next_event()[1].kind for _ in range(12)] == [f"tie{i}" for i in range(12)]


def test_virtual_delays_count_from_the_current_time_and_never_go_back():
  clock = _virtual()
  clock.after(2.0, Event("first"))
  clock.next_event()
  clock.after(-5.0, Event("now"))
  clock.after(1.5, Event("later"))
  assert clock.next_event() == (2.0, Event("now"))
  assert clock.next_event() == (3.5, Event("later"))


def test_cancel_removes_matching_events_and_keeps_the_order_of_the_rest():
  clock = _virtual()
  for i, learner in enumerate([0, 1, 0, 1, 1]):
    clock.after(1.0, Event("done", learner, i))
  clock.cancel(lambda e: e.learner == 0)
  assert clock.pending() == 3
  assert [clock.next_event()[1].payload for _ in range(3)] == [1, 3, 4]


def test_modeled_step_time_is_speed_times_straggling_and_seeded_jitter():
  clock = _virtual(step_seconds=2.0, speeds=(1.0, 1.5))
  assert clock.step_seconds(1) == 3.0
  clock.set_slowdown(1, 4.0)
  assert clock.step_seconds(1) == 12.0
  clock.set_slowdown(1, 1.0)
  jittered = [_virtual(jitter=0.2).step_seconds(0) for _ in range(2)]
  assert jittered[0] == jittered[1] != 1.0  # the same seed draws the same noise
  assert clock.transfer_seconds(2e9) == pytest.approx(2.0)  # 1 GB/s


def test_real_clock_hands_back_work_in_the_order_it_finishes():
  clock = RealClock(ClockConfig(kind="real"), num_learners=1, seed=0)
  slow, fast = concurrent.futures.Future(), concurrent.futures.Future()
  clock.on_done(slow, 0.0, Event("slow"))
  clock.on_done(fast, 0.0, Event("fast"))
  fast.set_result(None)
  assert clock.next_event()[1].kind == "fast"
  slow.set_result(None)
  clock.after(0.0, Event("timer"))
  kinds = {clock.next_event()[1].kind for _ in range(2)}
  assert kinds == {"slow", "timer"}
  with pytest.raises(RuntimeError, match="nothing scheduled"):
    clock.next_event()
  clock.close()
  assert np.isfinite(clock.now())


def test_real_time_stands_still_until_the_run_resumes_it_and_a_link_takes_its_latency_and_bandwidths_time():
  clock = RealClock(ClockConfig(kind="real", latency_s=0.3, bandwidth_bytes_per_s=1e9), num_learners=1, seed=0)
  clock.after(0.05, Event("fault"))  # due 0.05 s into the run
  time.sleep(0.1)  # (set-up and compiles: not the run's time)
  assert clock.now() == 0.0
  clock.resume()
  assert clock.transfer_seconds(2e8) == pytest.approx(0.5)
  at, event = clock.next_event()
  assert event.kind == "fault" and at == pytest.approx(0.05) and 0.05 <= clock.now() < 0.09
  clock.close()


def test_a_real_stragglers_part_finishes_factor_times_as_long_after_it_began():
  """A part that began 0.1 s ago and is done now is handed back 0.2 s later, at its start + 3 × 0.1 s."""
  clock = RealClock(ClockConfig(kind="real"), num_learners=2, seed=0)
  clock.resume()
  done = jax.block_until_ready(jax.device_put(np.zeros(4)))
  began, waited = clock.now() - 0.1, time.perf_counter()
  finished = clock._part_finished_at(done, began, 3.0, None, [])  # pylint: disable=protected-access
  assert finished == pytest.approx(began + 0.3, abs=0.02)
  assert time.perf_counter() - waited >= 0.18 and clock.now() >= finished
  clock.set_slowdown(1, 3.0)
  clock.on_done(jax.device_put(np.zeros(4)), 0.0, Event(EventKind.PART_DONE, 0))  # not straggling: at once
  at, event = clock.next_event()
  assert event.learner == 0 and at <= clock.now() < at + 0.05
  clock.close()


def test_a_real_stragglers_queued_part_is_slowed_from_where_the_part_ahead_ended():
  """Queued 0.5 s ago behind a part that really ended 0.1 s ago and is handed back 0.4 s from now, a part done now
  ran 0.1 s on the device: at twice as long, it is handed back 0.2 s after the part ahead (not 2 × 0.5 s after it
  was queued, which let a straggler of factor <= 2 keep pace with two parts in flight)."""
  clock = RealClock(ClockConfig(kind="real"), num_learners=1, seed=0)
  clock.resume()
  done = jax.block_until_ready(jax.device_put(np.zeros(4)))
  now, ahead = clock.now(), concurrent.futures.Future()
  ahead.set_result(now + 0.4)
  finished = clock._part_finished_at(done, now - 0.5, 2.0, (ahead, [now - 0.1]), [])  # pylint: disable=protected-access
  assert finished == pytest.approx(now + 0.6, abs=0.03) and clock.now() >= finished
  failed = concurrent.futures.Future()
  failed.set_exception(RuntimeError("its slice crashed"))  # a failed part ahead: this one's own time alone
  now = clock.now()
  finished = clock._part_finished_at(done, now - 0.1, 2.0, (failed, [now]), [])  # pylint: disable=protected-access
  assert finished == pytest.approx(now + 0.1, abs=0.03)
  clock.close()


class _FailedPart:
  """A part's outputs whose program failed: awaiting them raises."""

  def block_until_ready(self):
    raise RuntimeError("its slice crashed")


def test_a_queued_part_that_failed_is_handed_back_after_the_part_ahead():
  """The part behind a straggler's held-back part fails on its device at once: its failure surfaces only once the
  part ahead is handed back, so the controller collects that one first (not at the failure's time); and a part whose
  waiter was cancelled is followed by none."""
  clock = RealClock(ClockConfig(kind="real"), num_learners=1, seed=0)
  clock.resume()
  ahead = concurrent.futures.Future()
  threading.Timer(0.2, lambda: ahead.set_result(clock.now())).start()
  began = time.perf_counter()
  with pytest.raises(RuntimeError, match="its slice crashed"):
    clock._part_finished_at(_FailedPart(), clock.now(), 1.0, (ahead, [clock.now()]), [])  # pylint: disable=protected-access
  assert time.perf_counter() - began >= 0.18
  clock.on_done(jax.device_put(np.zeros(4)), 0.0, Event(EventKind.PART_DONE, 0))
  clock.cancel(lambda e: e.learner == 0)
  assert not clock._last_part  # pylint: disable=protected-access
  clock.close()
