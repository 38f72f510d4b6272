"""The one "is it time?" helper: each shape fires exactly when the checks it replaced fired."""

from hypothesis import given, strategies as st

from runtime.periodic import Marks, SinceLast, due


@given(st.integers(1, 500), st.integers(1, 50), st.one_of(st.none(), st.integers(1, 500)))
def test_due_every_nth_step_and_at_the_last(step, every, last):
  assert due(step, every, last) == (step % every == 0 or step == last)


def test_due_forced_once_at_an_uneven_last_step():
  assert [s for s in range(1, 24) if due(s, 10, 23)] == [10, 20, 23]
  assert [s for s in range(1, 24) if due(s, 10)] == [10, 20]


@given(st.integers(1, 1000), st.lists(st.integers(0, 3000), max_size=40))
def test_marks_advanced_past_a_count_fire_as_the_catch_up_loop_did(every, increments):
  marks, next_mark, count = Marks(every), every, 0
  for inc in increments:
    count += inc
    assert marks.reached(count) == (count >= next_mark)
    if marks.reached(count):
      marks.advance_past(count)
      while next_mark <= count:
        next_mark += every
    assert marks.next == next_mark and marks.next > count


@given(st.integers(1, 1000), st.integers(0, 40))
def test_marks_advanced_one_interval_at_a_time_stay_every_apart(every, advances):
  marks = Marks(every)
  for _ in range(advances):
    marks.advance()
  assert marks.next == (advances + 1) * every


def test_marks_skip_the_marks_a_jump_passed_over():
  marks = Marks(100)
  assert not marks.reached(99)
  marks.advance_past(350)
  assert marks.next == 400 and not marks.reached(399) and marks.reached(400)


@given(st.integers(0, 5), st.floats(0, 100), st.lists(st.tuples(st.integers(0, 4), st.floats(0, 30)), max_size=30))
def test_since_last_fires_after_enough_counts_or_enough_time(every, seconds, moves):
  schedule, last, count, now = SinceLast(every, seconds), (0, 0.0), 0, 0.0
  for more, later in moves:
    count, now = count + more, now + later
    expected = bool((every and count - last[0] >= every) or (seconds and now - last[1] >= seconds))
    assert schedule.due(count, now) == expected
    if expected:
      schedule.done(count, now)
      last = (count, now)


def test_since_last_with_both_measures_off_is_never_due():
  assert not SinceLast().due(10**6, 1e9)
  assert SinceLast(every=2).due(2, 0.0) and SinceLast(seconds=5.0).due(0, 5.0)
