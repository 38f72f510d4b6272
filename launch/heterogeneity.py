"""The heterogeneous-hardware experiment: `python -m launch.heterogeneity --config=configs/heterogeneity.py`."""

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "configs/heterogeneity.py", "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/heterogeneity", "Where the table and the plot go.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; every variant runs on each.")
_VARIANTS = flags.DEFINE_list("variants", [], "Variants to run (default: all); see runtime/heterogeneity.py.")


def main(argv: list[str]) -> None:
  del argv
  from runtime import heterogeneity, modes  # pylint: disable=g-import-not-at-top
  modes.cli(heterogeneity.run, _CONFIG.value, _WORKDIR.value, [int(s) for s in _SEEDS.value],
            _VARIANTS.value or list(heterogeneity.VARIANTS))


if __name__ == "__main__":
  app.run(main)
