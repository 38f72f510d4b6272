"""The scavenging experiment: `python -m launch.scavenging --config=configs/scavenging.py`."""

from absl import flags

from runtime import cli

_CONFIG = cli.define_config("scavenging", "Experiment config: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/scavenging", "Where the table and the plot go.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; every variant runs on each.")
_GROWTH = flags.DEFINE_list("growth", ["8", "16"], "Learners while capacity is lent (the base's plus lent slices).")
_LEND_AT = flags.DEFINE_float("lend_at", 30.0, "Modeled second the slices are lent at.")
_LEND_SECONDS = flags.DEFINE_float("lend_seconds", 150.0, "Modeled seconds they stay lent.")


def main(argv: list[str]) -> None:
  del argv
  cli.launch("runtime.experiments.scavenging:run", _CONFIG.value, _WORKDIR.value, cli.integers("seeds", _SEEDS.value),
             cli.integers("growth", _GROWTH.value), _LEND_AT.value, _LEND_SECONDS.value)


if __name__ == "__main__":
  cli.run(main)
