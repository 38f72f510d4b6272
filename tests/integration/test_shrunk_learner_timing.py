"""A learner of two slices that loses one trains on at half speed: the same batch on half the devices."""

import pytest

from runtime.experiments import modes


@pytest.mark.slow  # CI time (mutations run slow tests too)
def test_a_learner_shrunk_to_one_of_its_two_slices_takes_twice_as_long_per_step(tiny_config):
  tiny_config.learners, tiny_config.slices_per_learner, tiny_config.num_devices = 1, 2, 2
  tiny_config.data.batch_size, tiny_config.total_steps = 8, 8
  tiny_config.inner_steps, tiny_config.overlap_steps = 2, 1
  tiny_config.faults.schedule = "crash:learner=0,time=2.5,slice=1,repair=100"  # never back within the run
  tiny_config.faults.reconfig_seconds = 1.0
  result = modes.train(tiny_config, None)[0]
  (done,) = result.details["completions"]
  assert [steps for _, steps in done] == [1] * 8  # parts of one step (H − τ, then τ)
  # Two 1 s steps on both slices; the crash at 2.5 s loses the part in flight and costs 1 s of reconfiguration;
  # then 2 s steps on the one slice left.
  assert [t for t, _ in done] == pytest.approx([1.0, 2.0, 5.5, 7.5, 9.5, 11.5, 13.5, 15.5])
