"""The data path's speed: `python -m launch.bench_loader` (the default config's learners and batches).

Prepares --input with each tokenizer (preparation rate), serves batches from the prepared shards as training does
(shards per learner and the data service) next to the byte-level text in memory, and compares with the tokens/s
the learners' own programs consume on this machine (target: the loader serves >= 10x). Results: docs/data.md.
"""

from absl import flags

from runtime import cli
from runtime.bench import loader as bench

_DEFAULTS = bench.LoaderBenchConfig()
_CONFIG = cli.define_config("default", "Model, learners and batch whose consumption the loader must outpace.")
_INPUT = flags.DEFINE_string("input", _DEFAULTS.input, "Text to prepare: 'stdlib', a file, a directory or a glob.")
_TOKENIZERS = flags.DEFINE_list("tokenizers", list(_DEFAULTS.tokenizers), "Tokenizers to prepare with.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", _DEFAULTS.vocab_size, "Vocabulary of the sentencepiece tokenizer.")
_WORKERS = flags.DEFINE_integer("workers", _DEFAULTS.workers, "Preparation worker processes.")
_RECORD_TOKENS = flags.DEFINE_list("record_tokens", [str(t) for t in _DEFAULTS.record_tokens],
                                   "Most tokens per record; each value a preparation of its own.")
_DOCUMENT_BYTES = flags.DEFINE_integer("document_bytes", _DEFAULTS.document_bytes,
                                       "If > 0, the input's files joined into documents of at least this many bytes.")
_BATCHES = flags.DEFINE_integer("batches", _DEFAULTS.batches, "Batches served per learner per measurement.")
_ROUNDS = flags.DEFINE_integer("rounds", _DEFAULTS.rounds, "Timed rounds per learner of the learners' programs.")


def main(argv: list[str]) -> None:
  del argv
  tokenizers = cli.choices("tokenizers", _TOKENIZERS.value, ("byte", "sentencepiece"))
  cli.guarded(lambda: bench.run(_CONFIG.value, bench.LoaderBenchConfig(
      input=_INPUT.value, tokenizers=tuple(tokenizers), vocab_size=_VOCAB_SIZE.value, workers=_WORKERS.value,
      record_tokens=tuple(cli.integers("record_tokens", _RECORD_TOKENS.value)),
      document_bytes=_DOCUMENT_BYTES.value, batches=_BATCHES.value, rounds=_ROUNDS.value)))


if __name__ == "__main__":
  cli.run(main)
