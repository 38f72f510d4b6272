"""Decoupled DiLoCo vs elastic DP vs DP on one fault trace: goodput, uptime, eval loss, timeline."""

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "configs/chaos.py", "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/chaos", "Where metrics, plots and the table go.")


def main(argv: list[str]) -> None:
  del argv
  from runtime import modes  # pylint: disable=g-import-not-at-top
  modes.cli(modes.chaos, _CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
