"""What checkpointing costs a real-clock Decoupled DiLoCo run: `python -m launch.bench_checkpoint`.

The run with a checkpoint every --seconds (or --every merges) alternates with the same run without, --repeats
times each: the controller's blocking time per save against the time between saves (target <= 5%), and throughput with
checkpoints on / off (target >= 0.97). The default config, configs/checkpointing.py, is the merge
benchmark's 100M-parameter model at a batch this 2-core machine trains in minutes; --config.* overrides it.
"""

from absl import flags

from runtime import cli
from runtime.bench import checkpointing as bench

_DEFAULTS = bench.CheckpointBenchConfig()
_CONFIG = cli.define_config("checkpointing", "Model, batch and devices to benchmark: a path or a name.")
_REPEATS = flags.DEFINE_integer("repeats", _DEFAULTS.repeats, "Runs of each contender, alternating.")
_EVERY = flags.DEFINE_integer("every", _DEFAULTS.every, "Merges between checkpoints (0: by --seconds only).")
_SECONDS = flags.DEFINE_float("seconds", _DEFAULTS.seconds, "Wall seconds between checkpoints (0: by --every only).")
_SKIP_ROUNDS = flags.DEFINE_integer("skip_rounds", _DEFAULTS.skip_rounds, "Rounds per learner left untimed.")


def main(argv: list[str]) -> None:
  """Builds the benchmark config from the flags and runs it."""
  del argv
  cli.guarded(lambda: bench.run(_CONFIG.value, bench.CheckpointBenchConfig(
      repeats=_REPEATS.value, every=_EVERY.value, seconds=_SECONDS.value, skip_rounds=_SKIP_ROUNDS.value)))


if __name__ == "__main__":
  cli.run(main)
