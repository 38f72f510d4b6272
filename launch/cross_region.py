"""The cross-region experiment: `python -m launch.cross_region --config=configs/cross_region.py`."""

from absl import flags

from runtime import cli

_CONFIG = cli.define_config("cross_region", "Experiment config: a path or a name.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/cross_region", "Where the tables and the plot go.")
_BANDWIDTHS = flags.DEFINE_list("bandwidths", ["1e6", "1e5", "5e4", "3e4", "1e3"],
                                "Inter-region bandwidths (bytes per modeled second) besides unlimited.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of the compression-quality runs.")
_VARIANTS = flags.DEFINE_list("variants", [], "A subset of the variants: dp, decoupled_fp32, decoupled_int4, "
                                "decoupled_topk, decoupled_int4_down, decoupled_topk_down (Θ down compressed too), "
                                "sync_no_overlap (default: all).")


def main(argv: list[str]) -> None:
  del argv
  cli.launch("runtime.experiments.cross_region:run", _CONFIG.value, _WORKDIR.value,
             cli.floats("bandwidths", _BANDWIDTHS.value), cli.integers("seeds", _SEEDS.value), tuple(_VARIANTS.value))


if __name__ == "__main__":
  cli.run(main)
