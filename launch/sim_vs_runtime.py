"""The goodput simulator against the runtime on one trace: `python -m launch.sim_vs_runtime`."""

from absl import flags

from runtime import cli

_CONFIG = cli.define_config("sim_vs_runtime", "Experiment config: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/sim_vs_runtime", "Where the table goes.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds: one trace per seed and row.")
_LEARNERS = flags.DEFINE_list("learners", ["2", "4"], "Decoupled rows: learners M, each on slices / M slices.")
_SLICES = flags.DEFINE_integer("slices", 8, "Slices of the job (one simulated device each).")
_SPARES = flags.DEFINE_integer("spares", 1, "Hot spares of data-parallel and of restarting learners.")
_HORIZON = flags.DEFINE_float("horizon_factor", 4.0, "Trace length over the failure-free time to the budget.")
_INTERVAL = flags.DEFINE_integer("interval_seeds", 200, "Simulated traces behind the simulator's 95% range.")
_DEVICES_PER_SLICE = flags.DEFINE_integer("devices_per_slice", 1, "Simulated CPU devices of each slice.")


def main(argv: list[str]) -> None:
  del argv
  cli.launch("runtime.experiments.sim_vs_runtime:run", _CONFIG.value, _WORKDIR.value,
             cli.integers("seeds", _SEEDS.value), cli.integers("learners", _LEARNERS.value), _SLICES.value,
             _SPARES.value, _HORIZON.value, _INTERVAL.value, _DEVICES_PER_SLICE.value)


if __name__ == "__main__":
  cli.run(main)
