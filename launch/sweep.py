"""Runs a grid (or list) of configs, one workdir and process per point, then one table and plot comparing them.

  python -m launch.sweep --config=smoke --sweep='outer.quorum=1,2;inner_steps=5,10' --workdir=workdirs/sweep

--config.FIELD=value overrides apply to every point. Run it again with the same flags to resume: points whose
results exist are skipped. Each point's files are in <workdir>/<point>/ (log.txt holds its output).
"""

import sys

from absl import flags

from runtime import cli

_CONFIG = cli.define_config("smoke", "Base config of every point: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/sweep", "Where each point's workdir and the comparison go.")
_SWEEP = flags.DEFINE_string("sweep", None, "Fields and values: 'outer.quorum=1,2;inner_steps=5,10'.")
_KIND = flags.DEFINE_enum("sweep_kind", "grid", ["grid", "list"],
                          "grid: every combination; list: the i-th values of every field together.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Points run at once, each in its own process.", lower_bound=1)


def main(argv: list[str]) -> None:
  del argv
  from runtime.experiments import sweep  # pylint: disable=g-import-not-at-top
  base = [f"--config.{field}={cli.typed_text(value)}" for field, value in cli.overrides().items()]
  points = cli.guarded(sweep.parse, _SWEEP.value, _KIND.value)
  try:
    cli.guarded(sweep.run, cli.config_file(), _CONFIG.value, base, points, _WORKDIR.value, _PARALLEL.value)
  except sweep.SweepFailed as error:
    sys.exit(f"error: {error}")

if __name__ == "__main__":
  flags.mark_flags_as_required(["sweep"])
  cli.run(main)
