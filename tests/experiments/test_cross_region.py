"""Regions in whole runs: bytes on each path as recorded, DP's all-reduce in its step time, the experiment."""

import jax
import pytest

from runtime.experiments import cross_region

from runtime.experiments import modes
from runtime.train.harness import Experiment


def _run(config):
  run = modes.prepare(config)
  return modes.train_one(run, Experiment(run), None, "run")


def test_every_report_and_theta_is_charged_its_bytes_and_records_say_which_crossed_regions(tiny_config,
                                                                                          sent_payloads):
  tiny_config.links.num_regions = 2  # learners 1 and 3 reach the syncer across regions
  tiny_config.links.inter_region_bandwidth_bytes_per_s = 1e5
  tiny_config.compression.up = "int4"
  result = _run(tiny_config)
  # Θ's slow trip down outlasts the next merge; the version it carries must still rebuild the next report.
  assert not [f for f in result.details["faults"] if f["fault"] == "quarantine"]
  merges = [r for r in result.records if r["kind"] == "merge"]
  param_bytes = 4 * sum(x.size for x in jax.tree.leaves(result.params))
  reports = [(b, c, m) for r in merges for b, c, m in zip(r["up_bytes"], r["crossed"], r["merged"])]
  assert sum(b for b, _, _ in reports) == sum(p.nbytes for p in sent_payloads) == result.extras["bytes_up"]
  assert all(c == (m % 2 == 1) for _, c, m in reports)
  assert merges[-1]["cross_bytes_up"] == sum(b for b, c, _ in reports if c)
  assert merges[-1]["cross_bytes_down"] == param_bytes * sum(c for _, c, _ in reports)
  assert result.extras["cross_bytes_per_token"] == pytest.approx(
      (merges[-1]["cross_bytes_up"] + merges[-1]["cross_bytes_down"]) / result.tokens)
  assert param_bytes <= result.extras["peak_in_flight_learner"] <= result.extras["peak_in_flight_total"]


def test_dp_steps_take_compute_plus_the_all_reduce_when_learners_sit_in_regions(tiny_config):
  tiny_config.mode = "dp"
  tiny_config.links.num_regions = 2
  tiny_config.links.inter_region_bandwidth_bytes_per_s = 1e6
  result = _run(tiny_config)
  n = 4 * sum(x.size for x in jax.tree.leaves(result.params))  # 4 learner-sized groups, 2 per region
  step = 1.0 + 2 * 1 / 2 * n / 1e9 + 2 * 1 / 2 * n / 1e6
  assert result.virtual_seconds == pytest.approx(16 * step)
  assert result.extras["busy_mean"] == pytest.approx(1.0 / step)
  assert result.extras["cross_bytes_per_token"] == pytest.approx(2 * n / (16 * 32))


@pytest.mark.slow  # ~2 minutes on 2 cores: the dropout's crash hook compiles every learner's programs afresh
def test_the_cross_region_experiment_runs_end_to_end_and_checks_the_targets(tiny_config, tmp_path):
  tiny_config.links.num_regions = 2
  tiny_config.overlap_steps = 1
  rows, quality = cross_region.run(tiny_config, tmp_path, bandwidths=[1e4], seeds=[0],
                                   names=("dp", "decoupled_int4", "sync_no_overlap"))
  assert [(r["variant"], r["inter_B_per_s"]) for r in rows] == [
      (v, b) for v in ("dp", "decoupled_int4", "sync_no_overlap") for b in ("unlimited", "1e+04")]
  dp = {r["inter_B_per_s"]: r for r in rows if r["variant"] == "dp"}
  assert dp["unlimited"]["slowdown"] == 1.0 and dp["1e+04"]["slowdown"] > 10
  assert [q["variant"] for q in quality] == ["decoupled_int4"] and quality[0]["dp_over_this"] > 1
  assert (tmp_path / "cross_region.md").exists() and (tmp_path / "cross_region_slowdown.png").exists()
  assert any("int4" in t.text for t in cross_region.targets(rows, quality))
