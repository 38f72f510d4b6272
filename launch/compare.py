"""DP, synchronous DiLoCo and Decoupled DiLoCo at equal tokens: one table and one plot."""

from absl import flags

from runtime import cli
from runtime.config.run import MODES

_CONFIG = cli.define_config("default", "Experiment config: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/compare", "Where metrics, plots and the table go.")
_MODES = flags.DEFINE_list("modes", ["dp", "diloco_sync", "decoupled"], "Modes to run, in order.")


def main(argv: list[str]) -> None:
  del argv
  cli.launch("runtime.experiments.modes:compare", _CONFIG.value, _WORKDIR.value,
             tuple(cli.choices("modes", _MODES.value, MODES)), varied=cli.varied(cli.overrides()))


if __name__ == "__main__":
  cli.run(main)
