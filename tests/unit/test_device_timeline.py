"""A learner's device timeline: parts queued behind each other count once, gaps count as idle, time without a slice
counts not at all."""

import math

from runtime.diloco.learner.device_timeline import DeviceTimeline


def test_a_part_queued_behind_another_begins_when_it_ends_and_gaps_are_idle():
  t = DeviceTimeline()
  t.enqueued(0.0)
  t.enqueued(0.5)  # queued behind the first: begins at 2
  assert t.ran(0.0, 2.0) == 2.0 and t.ran(0.5, 3.0) == 1.0
  t.enqueued(4.0)  # a second with nothing enqueued: idle
  assert t.ran(4.0, 5.0) == 1.0
  assert math.isclose(t.idle_fraction([]), 1 / 5)
  assert (t.parts, t.last_seconds) == (3, 1.0)


def test_time_without_a_slice_is_not_in_the_span():
  t = DeviceTimeline()
  t.enqueued(0.0)
  t.ran(0.0, 1.0)
  t.enqueued(4.0)
  t.ran(4.0, 5.0)
  down = [("learner 0", 1.0, 3.5, "down"), ("learner 0", 3.5, 4.0, "waiting")]
  assert math.isclose(t.idle_fraction(down), 0.5 / 2.5)  # (waiting counts: its device had nothing to do)


def test_before_any_part_ended_the_fraction_is_nan_and_the_snapshot_round_trips():
  assert math.isnan(DeviceTimeline().idle_fraction([]))
  t = DeviceTimeline()
  t.enqueued(1.0)
  t.ran(1.0, 2.5)
  assert DeviceTimeline.restored(t.snapshot()) == t and DeviceTimeline.restored(None) == DeviceTimeline()
