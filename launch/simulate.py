"""Prints the simulated goodput table beside the paper's Table 1 and writes goodput.png into the workdir."""

from absl import flags

from runtime import cli
from runtime.sim import config as sim_config
from runtime.sim import table

_CONFIG = cli.define_config("goodput", "Simulator config: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/goodput", "Folder that receives goodput.png.")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  cli.guarded(cli.check_workdir, _WORKDIR.value)
  print(cli.guarded(lambda: table.build(sim_config.from_config_dict(_CONFIG.value), _WORKDIR.value)))


if __name__ == "__main__":
  cli.run(main)
