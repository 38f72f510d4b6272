"""Steady-state throughput ratios: `python -m launch.benchmark --which=all`.

dp_overhead: the launcher's DP loop vs a hand-written jitted loop (target >= 0.95).
decoupled_vs_dp: real-clock Decoupled DiLoCo vs DP on the same devices and global batch (target >= 0.95),
  with the learners' round programs run by hand on the same slices as a third contender (no syncer):
  learners_vs_dp is what the simulated devices allow M learners, decoupled_vs_learners what the runtime
  keeps of it.
Each contender runs --repeats times, alternating; median ratios are reported. On the 2-core host at
load ~6: about 1 minute for dp_overhead, 3.5 for decoupled_vs_dp (twice that at load 10+). Other
processes move single ratios by +-15%: read the host load column before trusting one.
"""

from absl import flags

from runtime import cli
from runtime.bench import throughput as bench

_DEFAULTS = bench.BenchConfig()
_CONFIG = cli.define_config("default", "Model, batch and devices to benchmark: a path or a name.")
_WHICH = flags.DEFINE_enum("which", _DEFAULTS.which, [*bench.BENCHMARKS, "all"], "Benchmark(s) to run.")
_REPEATS = flags.DEFINE_integer("repeats", _DEFAULTS.repeats, "Runs of each contender, alternating.")
_DP_STEPS = flags.DEFINE_integer("dp_steps", _DEFAULTS.dp_steps, "Launcher DP steps per run.")
_SKIP_STEPS = flags.DEFINE_integer("skip_steps", _DEFAULTS.skip_steps, "DP steps left untimed (compilation).")
_HAND_STEPS = flags.DEFINE_integer("hand_steps", _DEFAULTS.hand_steps, "Hand-loop steps timed.")
_DILOCO_STEPS = flags.DEFINE_integer("diloco_steps", _DEFAULTS.diloco_steps,
                                     "Decoupled DiLoCo token budget in global-batch steps.")
_SKIP_ROUNDS = flags.DEFINE_integer("skip_rounds", _DEFAULTS.skip_rounds, "Rounds per learner left untimed.")
_HAND_ROUNDS = flags.DEFINE_integer("hand_rounds", _DEFAULTS.hand_rounds,
                                    "Rounds per learner timed in the hand-written learner loops.")


def main(argv: list[str]) -> None:
  """Builds the benchmark config from the flags and runs it."""
  del argv
  cli.guarded(lambda: bench.run(_CONFIG.value, bench.BenchConfig(
      which=_WHICH.value, repeats=_REPEATS.value, dp_steps=_DP_STEPS.value, skip_steps=_SKIP_STEPS.value,
      hand_steps=_HAND_STEPS.value, diloco_steps=_DILOCO_STEPS.value, skip_rounds=_SKIP_ROUNDS.value,
      hand_rounds=_HAND_ROUNDS.value)))


if __name__ == "__main__":
  cli.run(main)
