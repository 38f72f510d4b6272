"""A trained model's loss on any data: `python -m launch.evaluate --model=WORKDIR/RUN/model [--data=PATH]`.

--model takes a model (repeat the flag for more; globs allowed: 'workdirs/sweep/*/model'), one table row each:
loss in nats per token and bits per byte, comparable across runs and tokenizers. --data is a text path or a prepared
dataset (default: the run's own data); its evaluation split is scored, every window, unless --windows=run (exactly
the run's held-out batches: the run's final eval loss). Docs: docs/model.md.
"""

import glob
import json

from absl import flags

from runtime import cli

_MODEL = flags.DEFINE_multi_string("model", None, "A model or run directory (a glob allowed); repeat the flag for "
                                    "more, one row each (run names hold commas, so they are not separators).")
_MERGE = flags.DEFINE_integer("merge", None, "Read Θ after this many merges from each run's checkpoints.")
_DATA = flags.DEFINE_string("data", None, "Text path or prepared dataset (default: the run's data).")
_SPLIT = flags.DEFINE_enum("split", "eval", ["eval", "train", "all"],
                           "Which split of the data to score; all: a text path whole (held-out text).")
_WINDOWS = flags.DEFINE_enum("windows", "all", ["all", "run"], "Every window, or the run's own eval batches.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Windows per batch.")
_MAX_WINDOWS = flags.DEFINE_integer("max_windows", 0, "Score at most this many windows (0: all).")
_OUTPUT = flags.DEFINE_string("output", None, "Also append each row to this JSONL file.")
_PROGRESS = flags.DEFINE_boolean("progress", True, "Show a progress bar.")


def main(argv: list[str]) -> None:
  del argv
  if not _MODEL.value:
    cli.fail("--model is required: allowed a model or run directory, or a glob of them (the flag repeats)")
  paths = [match for pattern in _MODEL.value for match in (sorted(glob.glob(pattern)) or [pattern])]

  def rows() -> list[dict]:
    from runtime.trained import evaluation, saved  # pylint: disable=import-outside-toplevel  (JAX from here on)
    return [dict(evaluation.evaluate(saved.load_model(path, merge=_MERGE.value), _DATA.value, split=_SPLIT.value,
                                     windows=_WINDOWS.value, batch_size=_BATCH_SIZE.value,
                                     max_windows=_MAX_WINDOWS.value, progress=_PROGRESS.value), path=path)
            for path in paths]

  table = cli.guarded(rows)
  from runtime.reporting.summary import summary_table  # pylint: disable=import-outside-toplevel
  print(summary_table(table, ["path", "data", "split", "windows", "tokens", "loss", "bits_per_byte",
                              "train_eval_loss"]))
  if _OUTPUT.value:
    with open(_OUTPUT.value, "a", encoding="utf-8") as f:
      f.writelines(json.dumps(row) + "\n" for row in table)


if __name__ == "__main__":
  cli.run(main)
