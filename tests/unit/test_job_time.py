"""A data-parallel job's time under either clock (runtime/baselines/job_time.py)."""

import time

import pytest

from runtime.baselines import job_time


def test_modeled_time_loses_the_step_a_failure_falls_in_and_moves_only_as_told():
  clock = job_time.ModeledTime(step_s=1.0, total_steps=10)
  clock.start()
  assert clock.fails_in_step(0.5) and not clock.fails_in_step(1.0)  # before the step's end, or not
  assert clock.stepped(0.0, None) == 1.0 and clock.now() == 1.0
  clock.wait_until(0.5)  # (never back)
  clock.wait_until(4.0)
  assert clock.now() == 4.0 and not clock.gave_up()
  clock.wait_until(job_time.GIVE_UP_FACTOR * 10)
  assert clock.gave_up()


def test_wall_time_fails_the_next_step_once_a_failure_has_come_and_stands_still_while_set_aside():
  clock = job_time.WallTime(total_steps=10)
  clock.start()
  assert not clock.fails_in_step(5.0) and clock.fails_in_step(0.0)
  with clock.aside():
    time.sleep(0.2)
  assert clock.now() < 0.15  # an evaluation is no part of the job's time
  clock.wait_until(0.25)
  assert clock.now() == pytest.approx(0.25, abs=0.1)
  assert not clock.gave_up()  # never before a step
  assert clock.stepped(clock.now() - 0.01, None) >= 0.01
  assert clock.extras()["step_seconds"] >= 0.01 and clock.extras()["run_seconds"] >= 0.25
