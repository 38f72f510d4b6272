"""The heterogeneous-hardware experiment: `python -m launch.heterogeneity --config=configs/heterogeneity.py`."""

from absl import flags

from runtime import cli

_CONFIG = cli.define_config("heterogeneity", "Experiment config: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/heterogeneity", "Where the table and the plot go.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; every variant runs on each.")
_VARIANTS = flags.DEFINE_list("variants", [],
                              "Variants to run (default: all); see runtime/experiments/heterogeneity.py.")


def main(argv: list[str]) -> None:
  del argv
  cli.launch("runtime.experiments.heterogeneity:run", _CONFIG.value, _WORKDIR.value,
             cli.integers("seeds", _SEEDS.value), _VARIANTS.value or None)


if __name__ == "__main__":
  cli.run(main)
