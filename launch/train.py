"""Trains one run in the mode its config names: `python -m launch.train --config=default --workdir=/tmp/run`.

--config takes a config file's path (from any directory) or a name from configs/ (default, smoke, dp, ...);
every field is overridable with --config.FIELD=value, and --help lists them all.
"""

from absl import flags

from runtime import cli

_CONFIG = cli.define_config("default", "Experiment config: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/default", "Where metrics, plots and summaries go.")
_RUN_NAME = flags.DEFINE_string("run_name", "", "The run's name and its directory under --workdir (default: its "
                                "mode). The same name resumes the run there; another name starts a new one.")


def main(argv: list[str]) -> None:
  del argv
  name = cli.guarded(cli.run_name, _CONFIG.value, _RUN_NAME.value)
  cli.launch("runtime.experiments.modes:train", _CONFIG.value, _WORKDIR.value, name=name)


if __name__ == "__main__":
  cli.run(main)
