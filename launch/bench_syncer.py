"""The syncer's memory and merge time at scale: `python -m launch.bench_syncer`.

Flags: --params (model size, real fp32 arrays), --learners, --down and --fragments (comma-separated: every combination
is measured), --rounds. Prints a Markdown table of the bytes each structure holds per parameter (docs/results/syncer.md).
Needs about (M + 2) × 2 × params × 4 bytes of RAM per row (~0.6 GB at the defaults with M = 16).
"""

from absl import flags

from runtime import cli
from runtime.bench import syncer_memory

_DEFAULTS = syncer_memory.SyncerBenchConfig()
_PARAMS = flags.DEFINE_integer("params", _DEFAULTS.params, "Model size the tensors total.")
_LEARNERS = flags.DEFINE_list("learners", ["4", "8", "16"], "M values, each with quorum K = 1.")
_DOWN = flags.DEFINE_list("down", ["none", "int4"], "compression.down values (a mirror per learner when not none).")
_FRAGMENTS = flags.DEFINE_list("fragments", ["1", "4"], "Fragment counts P.")
_ROUNDS = flags.DEFINE_integer("rounds", _DEFAULTS.rounds, "Reports per learner before the count.")


def main(argv: list[str]) -> None:
  """Builds one config per combination of the flags and prints the table."""
  del argv  # Unused: everything comes from flags.
  cli.guarded(lambda: print(syncer_memory.table([
      syncer_memory.run(syncer_memory.SyncerBenchConfig(params=_PARAMS.value, learners=int(m), down=down,
                                                         fragments=int(p), rounds=_ROUNDS.value))
      for m in _LEARNERS.value for down in _DOWN.value for p in _FRAGMENTS.value
      if down == "none" or int(p) == 1])))  # (Θ goes down compressed only unfragmented)


if __name__ == "__main__":
  cli.run(main)
