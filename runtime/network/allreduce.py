"""DP's gradient all-reduce on the links: hierarchical ring, time bounded by the slowest link.

Within each region a ring reduce-scatter over the learners' own links, then a ring all-reduce among the regions
over their inter-region links (each carries 2·(R−1)/R of the bytes, each way), then a ring all-gather within each
region. No overlap with compute: a step takes compute + all-reduce. Bytes are what the links carry (each byte
counted once, as it is sent); cross-region bytes are those on inter-region links.
"""

import dataclasses
from typing import Sequence

from runtime.config.run import RunConfig
from runtime.config.network import LinksConfig, active, region_of


@dataclasses.dataclass(frozen=True)
class AllReduce:
  """One all-reduce: its modeled seconds, and the bytes it sends over all links and over inter-region ones."""

  seconds: float
  link_bytes: float
  cross_region_bytes: float


def all_reduce(num_bytes: int, members_per_region: Sequence[int], bandwidth: float, latency: float,
               inter_bandwidth: float, inter_latency: float) -> AllReduce:
  """The all-reduce of `num_bytes` among regions with these member counts (regions without members left out)."""
  members = [p for p in members_per_region if p > 0]
  p, r = max(members), len(members)
  seconds = 2 * (p - 1) / p * num_bytes / bandwidth + 2 * (p - 1) * latency
  if r > 1:
    seconds += 2 * (r - 1) / r * num_bytes / inter_bandwidth + 2 * (r - 1) * inter_latency
  cross = 2 * (r - 1) * num_bytes  # r links, each sending 2·(r−1)/r of the bytes
  return AllReduce(seconds, sum(2 * (q - 1) * num_bytes for q in members) + cross, cross)


def dp_all_reduce(cfg: LinksConfig, participants: Sequence[int], num_bytes: int, bandwidth: float,
                  latency: float) -> AllReduce:
  """The all-reduce of DP participants (learner-sized slices, placed in regions as learners are)."""
  regions = [region_of(cfg, m) for m in participants]
  counts = [regions.count(r) for r in sorted(set(regions))]
  return all_reduce(num_bytes, counts, bandwidth, latency, cfg.inter_region_bandwidth_bytes_per_s,
                    cfg.inter_region_latency_s)


def dp_step(run: RunConfig, num_bytes: int, participants: Sequence[int]) -> tuple[float, float, AllReduce]:
  """A DP step's compute seconds (its slowest slice), its modeled seconds, and its all-reduce.

  The all-reduce's time counts only while the link model is active (links.enabled or more than one region): DP
  has always been charged compute alone, and recorded runs keep their numbers.
  """
  compute = run.clock.step_seconds * max(run.clock.speeds or (1.0,))
  comm = dp_all_reduce(run.links, participants, num_bytes, run.clock.bandwidth_bytes_per_s, run.clock.latency_s)
  return compute, compute + comm.seconds if active(run.links) else compute, comm


def dp_traffic(comm: AllReduce, tokens_per_step: float, num_bytes: int, participants: int) -> dict:
  """DP's bytes per trained token (all links, cross-region) and bytes in flight (every gradient, each step)."""
  return dict(bytes_per_token=comm.link_bytes / tokens_per_step,
              cross_bytes_per_token=comm.cross_region_bytes / tokens_per_step,
              peak_in_flight_learner=num_bytes, peak_in_flight_total=num_bytes * participants)
