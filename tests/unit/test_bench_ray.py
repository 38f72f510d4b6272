"""The Ray backend benchmark's arithmetic (runtime/bench/ray_backend.py): a row from merge records, and its config."""

import math

import pytest

from runtime.bench import ray_backend as bench
from runtime.errors import ConfigError


def _merge(i: int, **host) -> dict:
  return dict(kind="merge", wall=2.0 * i, bytes_up=1_000_000 * i, bytes_down=3_000_000 * i, num_merged=2,
              **{"host_report_s": 0.01, "host_report_copy_s": 0.01, "host_deliver_s": 0.02, "host_theta_copy_s": 0.0,
                 "host_adopt_s": 0.005, "host_controller_cpu_s": 0.004, **host})


def test_a_row_times_the_merges_after_those_skipped_and_counts_bytes_from_the_last_skipped():
  records = [_merge(i) for i in range(6)] + [dict(kind="eval", wall=99.0)]
  row = bench.row_of(4, "ray", records, skip=2, tokens_per_wall_s=10.0)
  assert row["merges"] == 3 and row["wall_ms_per_merge"] == pytest.approx(2000.0)
  assert row["controller_cpu_ms_per_merge"] == pytest.approx(4.0)
  assert row["report_MB_per_s"] == pytest.approx(3.0 / (3 * 0.02))  # 3 MB up in 3 x (report + its copy)
  assert row["theta_MB_per_s"] == pytest.approx(9.0 / (3 * (0.02 + 2 * 0.005)))  # adoptions: mean x merged
  assert math.isnan(row["round_trips_per_merge"])  # (none counted: in process)
  calls = {"collect": 12, "report": 12, "part_done": 12, "dispatch": 6}
  row = bench.row_of(4, "ray", records, skip=2, tokens_per_wall_s=10.0, calls=calls)
  assert row["round_trips_per_merge"] == pytest.approx(30 / 6)  # (a part's future waits, it is no round trip)


def test_a_merge_without_adoptions_counts_none_and_too_few_merges_are_refused():
  records = [_merge(i, host_adopt_s=math.nan) for i in range(4)]
  assert bench.row_of(4, "local", records, skip=1, tokens_per_wall_s=1.0)["theta_MB_per_s"] == pytest.approx(
      6.0 / (2 * 0.02))
  with pytest.raises(ValueError, match="too few"):
    bench.row_of(4, "local", records, skip=3, tokens_per_wall_s=1.0)


@pytest.mark.parametrize("field, value", [("learners", ()), ("backends", ("pathways",)), ("skip", -1)])
def test_a_bad_benchmark_setting_is_refused_naming_it(field, value):
  with pytest.raises(ConfigError, match=field):
    bench.RayBenchConfig(**{field: value})
