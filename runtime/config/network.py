"""Where learners sit and the links between regions, validated at the config boundary (no JAX)."""

import dataclasses
from typing import Any

from runtime.errors import check


@dataclasses.dataclass(frozen=True)
class LinksConfig:
  """Learners in regions (the syncer in region 0) and the inter-region link each region shares.

  A learner's own link to its region is clock.bandwidth_bytes_per_s / clock.latency_s; a learner outside region
  0 also crosses its region's inter-region link, which all of that region's learners share.
  """

  num_regions: int = 1  # learner m sits in region m mod num_regions, unless `regions` places it
  regions: tuple[int, ...] = ()  # one region per learner (empty: round-robin over num_regions)
  inter_region_bandwidth_bytes_per_s: float = 1e9  # each region's link to the others, each way
  inter_region_latency_s: float = 0.0
  enabled: bool = False  # the link model's records and DP's all-reduce time even in one region (on with > 1)


def num_regions(cfg: LinksConfig) -> int:
  """How many regions there are: num_regions, or more if `regions` names a higher one."""
  return max(cfg.num_regions, 1 + max(cfg.regions, default=0))


def active(cfg: LinksConfig) -> bool:
  """Whether the link model adds to records and to DP's step time (more than one region, or asked for)."""
  return cfg.enabled or num_regions(cfg) > 1


def region_of(cfg: LinksConfig, learner: int) -> int:
  """The region of a learner (those past `regions`, e.g. learners of lent slices: round-robin)."""
  return cfg.regions[learner] if learner < len(cfg.regions) else learner % num_regions(cfg)


def validate(run: Any) -> None:
  """Raises ConfigError on the first links field outside what it allows."""
  c = run.links
  check(c.num_regions >= 1, "links.num_regions", c.num_regions, "an integer >= 1")
  check(not c.regions or len(c.regions) == run.learners, "links.regions", c.regions,
        f"empty or one region per learner ({run.learners})")
  check(all(r >= 0 for r in c.regions), "links.regions", c.regions, "regions numbered from 0")
  check(c.num_regions == 1 or not c.regions or max(c.regions) < c.num_regions, "links.regions", c.regions,
        f"regions below links.num_regions ({c.num_regions})")
  check(c.inter_region_bandwidth_bytes_per_s > 0, "links.inter_region_bandwidth_bytes_per_s",
        c.inter_region_bandwidth_bytes_per_s, "a float > 0")
  check(c.inter_region_latency_s >= 0, "links.inter_region_latency_s", c.inter_region_latency_s, "a float >= 0")
