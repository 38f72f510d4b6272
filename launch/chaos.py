"""Decoupled DiLoCo vs elastic DP vs DP on one fault trace: goodput, uptime, eval loss, timeline."""

from absl import flags

from runtime import cli

_CONFIG = cli.define_config("chaos", "Experiment config: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/chaos", "Where metrics, plots and the table go.")


def main(argv: list[str]) -> None:
  del argv
  cli.launch("runtime.experiments.modes:chaos", _CONFIG.value, _WORKDIR.value, varied=cli.varied(cli.overrides()))


if __name__ == "__main__":
  cli.run(main)
