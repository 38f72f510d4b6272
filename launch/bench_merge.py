"""Times the syncer's RDA merge against a NumPy copy: `python -m launch.bench_merge`.

Flags: --params (model size), --learners (M), --repeats, --embed_mean, --seed. Needs about
3.3 x learners x params x 4 bytes of RAM (~10.5 GB at the defaults) and half a minute. Expect
merge_bw / copy_bw near 1 with a fresh output and above 1 with donated reports on an idle
2-core host (XLA uses every core, np.copyto one); the target is >= 0.5.
"""

from absl import flags

from runtime import cli
from runtime.bench import merge as merge_bench

_DEFAULTS = merge_bench.MergeBenchConfig()
_PARAMS = flags.DEFINE_integer("params", _DEFAULTS.params, "Model size the tensors total.")
_LEARNERS = flags.DEFINE_integer("learners", _DEFAULTS.learners, "Reports merged at once (M).")
_REPEATS = flags.DEFINE_integer("repeats", _DEFAULTS.repeats, "Timed runs of each side.")
_EMBED_MEAN = flags.DEFINE_boolean("embed_mean", _DEFAULTS.embed_mean,
                                   "Merge the embedding by plain mean, the rest by RDA.")
_SEED = flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of the random deltas.")


def main(argv: list[str]) -> None:
  """Builds the config from the flags and runs the benchmark."""
  del argv  # Unused: everything comes from flags.
  cli.guarded(lambda: merge_bench.run(merge_bench.MergeBenchConfig(
      params=_PARAMS.value, learners=_LEARNERS.value, repeats=_REPEATS.value,
      embed_mean=_EMBED_MEAN.value, seed=_SEED.value)))


if __name__ == "__main__":
  cli.run(main)
