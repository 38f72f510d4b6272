"""The asynchrony study: `python -m launch.asynchrony --config=configs/scaling.py:heterogeneity`.

Every cell of --sizes × --variants × --lengths × --rules × --bases × --seeds under the config (and its --config
overrides) is one run; its row is appended to --rows when it finishes, and a cell whose row is there is skipped:
stop it at any time, commit the rows, run the same command again to go on. The table of the grid's cells is printed
at the end (runtime/experiments/asynchrony.py).
"""

import os

from absl import flags

from runtime import cli

_CONFIG = cli.define_config("scaling.py:heterogeneity", "The setting: a config path or name (:variant allowed).")
_ROWS = flags.DEFINE_string("rows", "docs/results/asynchrony_rows.jsonl", "The tracked file the rows go into.")
_SIZES = flags.DEFINE_list("sizes", ["tiny"], "Model sizes (tiny, small).")
_VARIANTS = flags.DEFINE_list("variants", ["K=M", "K=1+grace"], "Merge policies (launch.heterogeneity's variants).")
_LENGTHS = flags.DEFINE_list("lengths", ["steps", "time"], "rounds.length values.")
_RULES = flags.DEFINE_list("rules", ["nesterov"], "outer.rule values.")
_BASES = flags.DEFINE_list("bases", ["current"], "outer.outer_grad_base values.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds.")
_TABLE_ONLY = flags.DEFINE_bool("table_only", False, "Only print the table of the grid's cells that have rows.")
_MARKDOWN = flags.DEFINE_bool("markdown", False, "Print the table as Markdown (for docs/results).")


def main(argv: list[str]) -> None:
  del argv
  from runtime.config.run import OUTER_GRAD_BASES, OUTER_RULES, ROUND_LENGTHS  # pylint: disable=g-import-not-at-top
  from runtime.experiments import asynchrony  # pylint: disable=g-import-not-at-top
  grid = asynchrony.Grid(sizes=tuple(_SIZES.value), variants=tuple(_VARIANTS.value),
                         lengths=tuple(cli.choices("lengths", _LENGTHS.value, ROUND_LENGTHS)),
                         rules=tuple(cli.choices("rules", _RULES.value, OUTER_RULES)),
                         bases=tuple(cli.choices("bases", _BASES.value, OUTER_GRAD_BASES)),
                         seeds=tuple(cli.integers("seeds", _SEEDS.value)))
  overrides = ",".join(f"{k}={cli.typed_text(v)}" for k, v in sorted(cli.overrides().items()))
  cli.launch("runtime.experiments.asynchrony:run", _CONFIG.value, os.path.dirname(_ROWS.value) or ".", _ROWS.value,
             asynchrony.setting_name(cli.config_file()), overrides, grid, _TABLE_ONLY.value, _MARKDOWN.value)


if __name__ == "__main__":
  cli.run(main)
