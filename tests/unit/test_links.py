"""Regions and links: a transfer's modeled time on its path, the queue on a shared inter-region link, bytes."""

import json

import pytest

from runtime.config import run as config_lib
from runtime.config.run import RunConfig, with_fields
from runtime.errors import ConfigError
from runtime.config.network import LinksConfig, active, region_of
from runtime.experiments import modes
from runtime.network.links import Links
from runtime.network.paths import Paths, peak_in_flight


def _paths(**links):
  own = lambda num_bytes: 0.01 + num_bytes / 1e9  # the clock's link: 10 ms, 1 GB/s
  return Paths(LinksConfig(**links), own, 1e9)


def test_a_transfer_within_the_syncers_region_costs_the_learners_own_link():
  paths = _paths(num_regions=2, inter_region_bandwidth_bytes_per_s=1e3)
  assert not paths.crosses(0) and paths.crosses(1)
  assert paths.seconds(0, 5.0, 2_000_000, "up") == 0.01 + 2_000_000 / 1e9


def test_a_transfer_across_regions_costs_both_latencies_plus_bytes_over_the_slower_link():
  paths = _paths(num_regions=2, inter_region_bandwidth_bytes_per_s=1e6, inter_region_latency_s=0.2)
  assert paths.seconds(1, 3.0, 500_000, "up") == pytest.approx(0.01 + 0.2 + 0.5)
  fast = _paths(num_regions=2, inter_region_bandwidth_bytes_per_s=1e12, inter_region_latency_s=0.2)
  assert fast.seconds(1, 3.0, 500_000, "up") == pytest.approx(0.01 + 0.2 + 500_000 / 1e9)  # own link is slower


def test_transfers_on_one_inter_region_link_queue_and_other_links_or_directions_do_not():
  paths = _paths(num_regions=3, inter_region_bandwidth_bytes_per_s=1e6)  # learners 1, 4 in region 1; 2 in 2
  first = paths.seconds(1, 0.0, 1_000_000, "up")
  second = paths.seconds(4, 0.5, 1_000_000, "up")  # waits for the first to leave the link at t=1
  other_region = paths.seconds(2, 0.5, 1_000_000, "up")
  down = paths.seconds(4, 0.5, 1_000_000, "down")
  assert first == pytest.approx(0.01 + 1.0)
  assert second == pytest.approx(2.0 - 0.5 + 0.01)  # both carried by t=2: the link's full bandwidth, shared
  assert other_region == pytest.approx(down) == pytest.approx(0.01 + 1.0)
  assert paths.seconds(1, 10.0, 1_000_000, "up") == pytest.approx(0.01 + 1.0)  # the queue has drained


def test_regions_are_round_robin_unless_placed_and_bad_placements_name_the_field():
  assert [region_of(LinksConfig(num_regions=3), m) for m in range(5)] == [0, 1, 2, 0, 1]
  assert [region_of(LinksConfig(regions=(1, 1, 0, 0)), m) for m in range(4)] == [1, 1, 0, 0]
  assert not active(LinksConfig()) and active(LinksConfig(num_regions=2)) and active(LinksConfig(enabled=True))
  run = RunConfig(learners=4)
  for fields, names in [({"links.regions": (0, 1)}, "one region per learner"),
                        ({"links.num_regions": 0}, "links.num_regions"),
                        ({"links.regions": (0, 1, 2, 3), "links.num_regions": 2}, "below links.num_regions"),
                        ({"links.inter_region_bandwidth_bytes_per_s": 0.0}, "a float > 0")]:
    with pytest.raises(ConfigError, match=names):
      with_fields(run, fields)
  assert config_lib.SECTIONS["links"] is LinksConfig


def test_peak_in_flight_counts_overlapping_and_queued_transfers():
  transfers = [(0, 0.0, 2.0, 100), (1, 1.0, 3.0, 50), (0, 2.0, 4.0, 30), (1, 5.0, 6.0, 70)]
  assert peak_in_flight(transfers) == (130, 180)  # learner 0 at t=2 (ends are inclusive); all at t=2
  assert peak_in_flight([]) == (0, 0)


def test_links_restored_from_a_snapshot_keep_delaying_and_dropping_reports_until_each_fault_ends(tiny_config):
  """Regression (the resume test missed it): a link fault under way is part of a checkpoint."""
  run = modes.prepare(tiny_config)
  links = Links(run, lambda num_bytes: 0.5, [100])
  links.fail(1, until=10.0, mode="drop")
  links.fail(2, until=10.0, mode="delay")
  again = Links(run, lambda num_bytes: 0.5, [100])
  again.restore(json.loads(json.dumps(links.snapshot())))
  assert again.send_up(1, 4.0) is None and again.send_up(2, 4.0) == pytest.approx(0.5 + 6.0)
  assert again.send_up(1, 11.0) == again.send_up(2, 11.0) == pytest.approx(0.5)
