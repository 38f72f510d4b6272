"""Prepares a dataset for training: `python -m launch.prepare_data --input=PATH --output=DIR --tokenizer=KIND`.

--input is text (`stdlib`, a file, a directory or a glob) and/or JSONL (one document per line, its text in
--text_field). --tokenizer is `byte`, `sentencepiece` (trained here with --vocab_size) or an existing tokenizer
file. DIR gets ArrayRecord shards, the tokenizer and manifest.json; train on it with --config.data.path=DIR.
Rerunning the same command finishes an interrupted preparation. Docs: docs/data.md.
"""

import shlex
import sys

from absl import flags

from runtime import cli
from runtime.data import prepare as prepare_lib

_D = prepare_lib.PrepareConfig(input="", output="")
_INPUT = flags.DEFINE_string("input", None, "Text and/or JSONL: 'stdlib', a file, a directory or a glob.")
_OUTPUT = flags.DEFINE_string("output", None, "Directory to write the prepared dataset into.")
_TOKENIZER = flags.DEFINE_string("tokenizer", _D.tokenizer, "'byte', 'sentencepiece', or a tokenizer file's path "
                                 "(a SentencePiece .model, or a Hugging Face tokenizer.json with the `hf` extra).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", None, "sentencepiece: the vocabulary to train (default 32768); "
                                   "otherwise, if given, it must be the tokenizer's.")
_SENTENCEPIECE_TYPE = flags.DEFINE_enum("sentencepiece_type", _D.sentencepiece_type, ["bpe", "unigram"],
                                        "SentencePiece model type.")
_TEXT_FIELD = flags.DEFINE_string("text_field", _D.text_field, "The JSONL field holding a document's text.")
_SKIP_BAD_LINES = flags.DEFINE_boolean("skip_bad_lines", _D.skip_bad_lines,
                                       "Drop (and count) JSONL lines without text instead of stopping at the first.")
_EVAL_FRACTION = flags.DEFINE_float("eval_fraction", _D.eval_fraction,
                                    "Share of documents held out for evaluation, chosen by a hash of each.")
_SHARD_BYTES = flags.DEFINE_integer("shard_bytes", _D.shard_bytes, "Input bytes per shard (a unit of work).")
_RECORD_TOKENS = flags.DEFINE_integer("record_tokens", _D.record_tokens,
                                      "Most tokens of a document per record (a window reads at most this much more).")
_WORKERS = flags.DEFINE_integer("workers", _D.workers, "Processes that tokenize shards in parallel.")
_PROGRESS = flags.DEFINE_boolean("progress", _D.progress, "Show a progress bar.")


def main(argv: list[str]) -> None:
  del argv
  for flag in (_INPUT, _OUTPUT):
    if not flag.value:
      cli.fail(f"--{flag.name} is required: allowed " + ("'stdlib', a file, a directory or a glob"
                                                         if flag is _INPUT else "a directory to write into"))
  cfg = prepare_lib.PrepareConfig(
      input=_INPUT.value, output=_OUTPUT.value, tokenizer=_TOKENIZER.value, vocab_size=_VOCAB_SIZE.value,
      sentencepiece_type=_SENTENCEPIECE_TYPE.value, text_field=_TEXT_FIELD.value,
      skip_bad_lines=_SKIP_BAD_LINES.value, eval_fraction=_EVAL_FRACTION.value, shard_bytes=_SHARD_BYTES.value,
      record_tokens=_RECORD_TOKENS.value, workers=_WORKERS.value, progress=_PROGRESS.value,
      command=shlex.join(["python", "-m", "launch.prepare_data", *sys.argv[1:]]))
  print(prepare_lib.summary(cli.guarded(prepare_lib.prepare, cfg), cfg.output))


if __name__ == "__main__":
  cli.run(main)
