"""DP, synchronous DiLoCo and Decoupled DiLoCo at equal tokens: one table and one plot."""

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/compare", "Where metrics, plots and the table go.")
_MODES = flags.DEFINE_list("modes", ["dp", "diloco_sync", "decoupled"], "Modes to run, in order.")


def main(argv: list[str]) -> None:
  del argv
  from runtime import modes  # pylint: disable=g-import-not-at-top
  modes.cli(modes.compare, _CONFIG.value, _WORKDIR.value, tuple(_MODES.value))


if __name__ == "__main__":
  app.run(main)
