"""DP's gradient all-reduce on the links: the hierarchical ring's time and bytes, and DP's step time."""

import pytest

from runtime.config.run import RunConfig, with_fields
from runtime.network.allreduce import all_reduce, dp_step


def test_one_region_is_a_ring_all_reduce_over_the_learners_own_links():
  ar = all_reduce(1_000_000, [4], bandwidth=1e9, latency=0.001, inter_bandwidth=1.0, inter_latency=9.0)
  assert ar.seconds == pytest.approx(2 * 3 / 4 * 1e6 / 1e9 + 2 * 3 * 0.001)
  assert ar.link_bytes == 4 * 2 * 3 / 4 * 1e6 and ar.cross_region_bytes == 0


def test_across_regions_the_inter_region_ring_adds_2_r_minus_1_over_r_of_the_bytes_on_the_slowest_link():
  n, r = 1_000_000, 4
  ar = all_reduce(n, [2, 2, 2, 2], bandwidth=1e9, latency=0.0, inter_bandwidth=1e5, inter_latency=0.05)
  intra = 2 * 1 / 2 * n / 1e9
  assert ar.seconds == pytest.approx(intra + 2 * (r - 1) / r * n / 1e5 + 2 * (r - 1) * 0.05)
  assert ar.cross_region_bytes == 2 * (r - 1) * n  # r links, each sending 2·(r−1)/r of the bytes
  uneven = all_reduce(n, [3, 1, 0], bandwidth=1e9, latency=0.0, inter_bandwidth=1e5, inter_latency=0.0)
  assert uneven.seconds == pytest.approx(2 * 2 / 3 * n / 1e9 + n / 1e5)  # the fullest region bounds the intra phases


def test_dp_steps_are_charged_the_all_reduce_only_while_the_link_model_is_active():
  run = RunConfig(learners=8)
  compute, step, comm = dp_step(run, 4_000_000, range(8))
  assert compute == step == run.clock.step_seconds and comm.seconds > 0  # the recorded default: compute alone
  slow = with_fields(run, {"links.num_regions": 2, "links.inter_region_bandwidth_bytes_per_s": 1e6})
  compute, step, comm = dp_step(slow, 4_000_000, range(8))
  assert step == pytest.approx(compute + 2 * 3 / 4 * 4e6 / 1e9 + 2 * 1 / 2 * 4e6 / 1e6)
  assert step > 5 * compute  # DP waits for every byte on the slow link, every step
