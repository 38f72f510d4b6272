"""Prints the simulated goodput table beside the paper's Table 1 and writes goodput.png into the workdir.

With --trace=PATH it instead writes the failure trace one setup drew for one seed (runtime/sim/trace.py).
"""

from absl import flags

from runtime import cli
from runtime.sim import config as sim_config
from runtime.sim import table
from runtime.sim import trace

_CONFIG = cli.define_config("goodput", "Simulator config: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/goodput", "Folder that receives goodput.png.")
_TRACE = flags.DEFINE_string("trace", "", "Write this JSON failure trace instead of the table.")
_TRACE_SETUP = flags.DEFINE_string("trace_setup", "Decoupled M=4", "The trace's setup, a table row's name.")
_TRACE_CHIPS = flags.DEFINE_integer("trace_chips", 4096, "The trace's chip count (4096: 16 slices of 256).")
_TRACE_SEED = flags.DEFINE_integer("trace_seed", 0, "The trace's seed index, as in the table's seeds.")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  config = cli.guarded(lambda: sim_config.from_config_dict(_CONFIG.value))
  cli.keep_freed_memory()
  if _TRACE.value:
    print(cli.guarded(lambda: trace.export(config, _TRACE_SETUP.value, _TRACE_CHIPS.value, _TRACE_SEED.value,
                                           _TRACE.value)))
    return
  cli.guarded(cli.check_workdir, _WORKDIR.value)
  print(cli.guarded(lambda: table.build(config, _WORKDIR.value)))


if __name__ == "__main__":
  cli.run(main)
