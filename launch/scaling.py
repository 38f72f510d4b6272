"""The scaling study: `python -m launch.scaling --config=configs/scaling.py --workdir=workdirs/scaling`.

DP and DiLoCo at equal tokens for each --sizes × --learners, with a grid of outer learning rates per M; every run its
own process and directory under --workdir. Run it again to resume; run it with other sizes or grids to add to the
same study. `--table_only` rebuilds the table and plot from what is there.
"""

import sys

from absl import flags

from runtime import cli

_CONFIG = cli.define_config("scaling", "Base config of every run: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/scaling", "Where each run's directory, the table and the plot go.")
_SIZES = flags.DEFINE_list("sizes", ["tiny", "small", "medium"], "Model sizes (presets of models/config.py).")
_LEARNERS = flags.DEFINE_list("learners", ["1", "2", "4", "8"], "Learner counts M of the DiLoCo runs.")
_OUTER_LRS = flags.DEFINE_list("outer_lrs", ["0.4", "0.6", "0.8", "1.0"], "Outer learning rates tried per M.")
_OUTER_MOMENTA = flags.DEFINE_list("outer_momenta", ["0.6", "0.9"], "Outer Nesterov momenta tried per M.")
_DP_LRS = flags.DEFINE_list("dp_lrs", ["3e-3", "6e-3", "1.2e-2"], "DP's inner learning rates tried per size.")
_FACTORS = flags.DEFINE_list("inner_lr_factors", ["1"],
                             "DiLoCo's inner learning rates tried per M: DP's best at the size times each.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", [], "DP's global batches tried per size (default: the config's "
                                 "data.batch_size); DiLoCo takes DP's best.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds: 0 runs the grids, the others rerun the best of DP and each M.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at once, each in its own process.", lower_bound=1)
_TABLE_ONLY = flags.DEFINE_bool("table_only", False, "Only rebuild the table and plot from the finished runs.")


def main(argv: list[str]) -> None:
  del argv
  from runtime.experiments import scaling, sweep  # pylint: disable=g-import-not-at-top
  if _TABLE_ONLY.value:
    cli.guarded(scaling.tabulate, _WORKDIR.value)
    return
  base = [f"--config.{field}={cli.typed_text(value)}" for field, value in cli.overrides().items()]
  grid = scaling.Grid(tuple(_SIZES.value), tuple(cli.integers("learners", _LEARNERS.value)),
                      tuple(cli.floats("outer_lrs", _OUTER_LRS.value)),
                      tuple(cli.floats("outer_momenta", _OUTER_MOMENTA.value)),
                      tuple(cli.floats("dp_lrs", _DP_LRS.value)), tuple(cli.floats("inner_lr_factors", _FACTORS.value)),
                      tuple(cli.integers("batch_sizes", _BATCH_SIZES.value)), tuple(cli.integers("seeds", _SEEDS.value)))
  try:
    cli.guarded(scaling.run, cli.config_file(), _CONFIG.value, base, grid, _WORKDIR.value, _PARALLEL.value)
  except sweep.SweepFailed as error:
    sys.exit(f"error: {error}")


if __name__ == "__main__":
  cli.run(main)
