"""Trains one run: `python -m launch.train --config=configs/default.py --workdir=/tmp/run`."""

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/default", "Where metrics, plots and summaries go.")


def main(argv: list[str]) -> None:
  del argv
  from runtime import modes  # pylint: disable=g-import-not-at-top
  modes.cli(modes.train, _CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
