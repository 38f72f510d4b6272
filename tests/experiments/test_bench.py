"""Benchmark rate arithmetic on synthetic run records, and the start-up benchmark on a tiny setting."""

import math

import pytest

from runtime.bench import startup
from runtime.bench import syncer_memory
from runtime.bench import throughput as bench
from runtime.errors import ConfigError


def _train(step, tokens, wall):
  return dict(kind="train", step=step, tokens=tokens, wall=wall)


def test_dp_rate_skips_warmup_and_the_record_logged_after_the_final_eval():
  records = [_train(1, 100, 50.0), _train(2, 200, 51.0), _train(3, 300, 52.0), _train(4, 400, 53.0),
             dict(kind="eval", step=4), _train(5, 500, 99.0)]
  assert bench.dp_tokens_per_second(records, skip_steps=2) == pytest.approx(200 / 2.0)
  with pytest.raises(ValueError, match="dp_steps"):
    bench.dp_tokens_per_second(records, skip_steps=4)


def test_diloco_rate_spans_whole_rounds_of_the_last_learner_to_warm_up():
  merges = [([0], 10, 1.0), ([1], 20, 2.0), ([0], 30, 3.0), ([1], 40, 4.0), ([0], 50, 5.0), ([1], 60, 6.0),
            ([0], 70, 7.0), ([1], 80, 9.0), ([0], 90, 20.0)]
  records = [dict(kind="merge", merged=m, tokens=t, wall=w) for m, t, w in merges]
  # Learner 1 warms up (2 merges) at index 3 and learner 1's last merge before the drain (index 7)
  # closes the window: 40 tokens in 5 s.
  assert bench.diloco_tokens_per_second(records, skip_rounds=2) == pytest.approx(40 / 5.0)
  with pytest.raises(ValueError, match="diloco_steps"):
    bench.diloco_tokens_per_second(records, skip_rounds=6)


def test_bench_config_names_the_bad_field():
  with pytest.raises(ConfigError, match="which"):
    bench.BenchConfig(which="everything")
  with pytest.raises(ConfigError, match="dp_steps"):
    bench.BenchConfig(dp_steps=5, skip_steps=10)
  with pytest.raises(ConfigError, match="hand_rounds"):
    bench.BenchConfig(hand_rounds=0)


def test_startup_bench_config_names_the_bad_field():
  with pytest.raises(ConfigError, match="learners"):
    startup.StartupBenchConfig(learners=())
  with pytest.raises(ConfigError, match="warmup_rounds"):
    startup.StartupBenchConfig(rounds=2, warmup_rounds=2)
  with pytest.raises(ConfigError, match="devices_per_slice"):
    startup.StartupBenchConfig(devices_per_slice=0)


@pytest.mark.slow  # CI time (~23 s on the 2-core host); `pytest -m slow` runs it
def test_startup_bench_warm_cache_compiles_nothing_and_ends_in_the_same_theta(tiny_config, capsys):
  tiny_config.model.d_model, tiny_config.model.mlp_dim, tiny_config.model.num_layers = 32, 64, 1
  tiny_config.inner_steps = 2
  rows = startup.run(tiny_config, startup.StartupBenchConfig(learners=(2,), rounds=2, warmup_rounds=1, routes=False))
  cold, warm = rows
  assert (cold["cache"], warm["cache"]) == ("cold", "warm") and cold["M"] == warm["M"] == 2
  assert cold["round compiles"] == 2  # one per slice: the cache key holds the device assignment on CPU
  assert warm["XLA compiles"] == 0 < cold["XLA compiles"] == warm["cache loads"]
  assert warm["Θ digest"] == cold["Θ digest"]
  for r in rows:
    assert 0 < r["ctrl CPU ms/round"] < math.inf and 0 < r["JAX share"] <= 1 and r["timed rounds"] == 2
    assert 0 < r["enqueue ms/round"] < r["ctrl CPU ms/round"]
  out = capsys.readouterr().out
  rows_printed = [line.split()[:4] for line in out.splitlines() if line.startswith("  2 ")]
  assert rows_printed.count(["2", "2", "plain", "warm"]) == 2  # as measured, and in the final table
  assert "at M=32: not measured" in out


@pytest.mark.parametrize("up,down,base,history,mirrors,reports", [
    ("none", "none", "current", 0.0, 0.0, 8.0),  # whole reports from the current Θ: no history read
    # ... measured from their base: one fp32 Θ per staggered learner (CI time: the two rows keeping the history run
    # with -m slow; a history cut too far fails the merges of tests/integration/test_wire_checkpoint.py anyway)
    pytest.param("none", "none", "base", 8.0, 0.0, 8.0, marks=pytest.mark.slow),
    ("none", "int4", "current", 0.0, 8.0, 8.0),  # Θ down compressed: one exact fp32 mirror per learner
    ("int4", "none", "base", 0.0, 0.0, None),  # compressed reports from their base: Δ̂ as sent, kept as bytes
    # ... rebuilt as Θ_base − Δ̂ for the current Θ: the history
    pytest.param("int4", "none", "current", 8.0, 0.0, None, marks=pytest.mark.slow),
])
def test_the_syncer_keeps_a_copy_of_theta_per_learner_only_where_something_reads_it(up, down, base, history, mirrors,
                                                                                  reports):
  """The syncer bench's figures (M = 2, K = 1, staggered versions): Θ and momentum 4 bytes per parameter each; Θ's
  history holds tensors only where a report reads its base; one mirror per learner with Θ compressed down; a merge
  of all M lands M reports, fp32 whole or int4 payloads (half a byte per value, a scale per block of 256)."""
  result = syncer_memory.run(syncer_memory.SyncerBenchConfig(params=60_000, vocab=256, learners=2, up=up, down=down,
                                                             base=base, rounds=2))
  assert result.per_param("theta") == result.per_param("momentum") == 4.0
  assert result.per_param("history") == history and result.per_param("mirrors") == mirrors
  if reports is None:
    assert 2 * 0.5 < result.per_param("reports") < 2 * 0.6  # (a small model: scales and padding take more)
  else:
    assert result.per_param("reports") == reports
  assert len(result.merge_seconds) == 4 and f"| 2 | {up} | {down} | {base} |" in syncer_memory.table([result])


def test_syncer_bench_config_names_the_bad_field():
  with pytest.raises(ConfigError, match="learners"):
    syncer_memory.SyncerBenchConfig(learners=0)
  with pytest.raises(ConfigError, match="base.*current"):
    syncer_memory.SyncerBenchConfig(base="latest")
  with pytest.raises(ConfigError, match="up.*int4"):
    syncer_memory.SyncerBenchConfig(up="int3")
