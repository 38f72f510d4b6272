"""Prints the simulated goodput table beside the paper's Table 1 and writes goodput.png."""

from absl import app
from absl import flags
from ml_collections import config_flags

from runtime.sim import config as sim_config
from runtime.sim import table

_CONFIG = config_flags.DEFINE_config_file("config", None, "Simulator config: configs/goodput.py.")
_WORKDIR = flags.DEFINE_string("workdir", ".", "Folder that receives goodput.png.")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  print(table.build(sim_config.from_config_dict(_CONFIG.value), _WORKDIR.value))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
