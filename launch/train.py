"""Trains one run in the mode its config names: `python -m launch.train --config=default --workdir=/tmp/run`.

--config takes a config file's path (from any directory) or a name from configs/ (default, smoke, dp, ...);
every field is overridable with --config.FIELD=value, and --help lists them all.
"""

from absl import flags

from runtime import cli

_CONFIG = cli.define_config("default", "Experiment config: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/default", "Where metrics, plots and summaries go.")


def main(argv: list[str]) -> None:
  del argv
  cli.launch("runtime.experiments.modes:train", _CONFIG.value, _WORKDIR.value, name=cli.run_name(_CONFIG.value))


if __name__ == "__main__":
  cli.run(main)
