"""Start-up compile time and controller CPU per learner round with many learners: `python -m launch.bench_startup`.

Each measurement is a fresh process: M learners (--learners) on --devices_per_slice simulated CPU devices each,
the persistent compilation cache cold and then warm, and (--routes) a cache key without the device assignment and
an ahead-of-time compiled program called on another slice. The run is configs/startup.py; --config.* overrides it.
"""

from absl import flags

from runtime import cli
from runtime.bench import startup as bench

_DEFAULTS = bench.StartupBenchConfig()
_CONFIG = cli.define_config("startup", "Model and run to start: a path or a name.")
_LEARNERS = flags.DEFINE_list("learners", [str(m) for m in _DEFAULTS.learners], "Learner counts M, one slice each.")
_DEVICES_PER_SLICE = flags.DEFINE_integer("devices_per_slice", _DEFAULTS.devices_per_slice,
                                          "Simulated CPU devices per slice.")
_ROUNDS = flags.DEFINE_integer("rounds", _DEFAULTS.rounds, "Rounds per learner.")
_WARMUP_ROUNDS = flags.DEFINE_integer("warmup_rounds", _DEFAULTS.warmup_rounds,
                                      "Rounds per learner before the controller's CPU is timed.")
_ROUTES = flags.DEFINE_boolean("routes", _DEFAULTS.routes, "Also measure the routes around per-slice compiles.")


def main(argv: list[str]) -> None:
  """Builds the benchmark config from the flags and runs it."""
  del argv
  cli.guarded(lambda: bench.run(_CONFIG.value, bench.StartupBenchConfig(
      learners=tuple(cli.integers("learners", _LEARNERS.value)), devices_per_slice=_DEVICES_PER_SLICE.value,
      rounds=_ROUNDS.value, warmup_rounds=_WARMUP_ROUNDS.value, routes=_ROUTES.value)))


if __name__ == "__main__":
  cli.run(main)
