"""The data path's speed: preparation rate, tokens/s the loader serves, and what the learners consume.

For each tokenizer the benchmark prepares the input (default: the standard library) into a fresh directory and
reads the rate from its manifest; then it serves batches from the prepared dataset exactly as training does (one
`ShardIterator` per learner, round robin, and the data service's windows), and the byte-level text held in memory
as the reference. The consumption is the learners' own round programs run by hand on their slices with no syncer
(`throughput.hand_learners_tokens_per_second`): the fastest the learners can take tokens on this machine. The
loader must serve at least 10 times that.
"""

import dataclasses
import pathlib
import tempfile
import time

import ml_collections

from runtime.data import corpus, prepare, shards
from runtime.data.service import DataService
from runtime.reporting.summary import summary_table

TARGET = 10.0  # the loader serves at least this many times what the learners consume


@dataclasses.dataclass(frozen=True)
class LoaderBenchConfig:
  input: str = "stdlib"
  tokenizers: tuple[str, ...] = ("byte", "sentencepiece")
  vocab_size: int = 32768  # of the sentencepiece tokenizer
  workers: int = 2
  record_tokens: tuple[int, ...] = (prepare.RECORD_TOKENS,)  # each a preparation (and rows) of its own
  document_bytes: int = 0  # > 0: the input's files joined into documents of at least this many bytes first
  batches: int = 400  # per learner, per measurement
  rounds: int = 4  # timed rounds per learner of the consumption measurement


def run(config: ml_collections.ConfigDict, bench: LoaderBenchConfig) -> list[dict]:
  """Prints and returns one row per data source."""
  from runtime.bench import throughput  # pylint: disable=import-outside-toplevel  (JAX only from here on)
  from runtime.experiments import modes  # pylint: disable=import-outside-toplevel
  from runtime.train.harness import Experiment  # pylint: disable=import-outside-toplevel
  run_cfg = modes.prepare(config)  # simulated CPU devices set up before JAX starts
  consumed = throughput.hand_learners_tokens_per_second(run_cfg, Experiment(run_cfg), bench.rounds)
  print(f"learners consume {consumed:,.0f} tokens/s ({run_cfg.learners} learners of the {config.model.size} "
        f"model, batch {run_cfg.data.batch_size}, seq_len {run_cfg.data.seq_len}; their programs by hand)", flush=True)
  with tempfile.TemporaryDirectory() as scratch:
    source = _joined(bench.input, bench.document_bytes, pathlib.Path(scratch) / "joined")
    rows = [_row("text in memory (byte)", corpus.load_corpus(source, 0.02), None, run_cfg, bench, consumed)]
    for kind in bench.tokenizers:
      for record_tokens in bench.record_tokens:
        output = pathlib.Path(scratch) / f"{kind}-{record_tokens}"
        manifest = prepare.prepare(prepare.PrepareConfig(
            input=source, output=str(output), tokenizer=kind, progress=False, record_tokens=record_tokens,
            vocab_size=bench.vocab_size if kind == "sentencepiece" else None, workers=bench.workers))
        print(prepare.summary(manifest, str(output)).splitlines()[1], flush=True)
        rows.append(_row(f"prepared ({kind}, vocabulary {manifest['tokenizer']['vocab_size']:,}, records of "
                         f"<= {record_tokens:,} tokens)", corpus.load_corpus(str(output), 0.02), manifest,
                         run_cfg, bench, consumed))
  print(summary_table(rows, list(rows[-1]), markdown=True), flush=True)
  return rows


def _joined(input_path: str, document_bytes: int, folder: pathlib.Path) -> str:
  """`input_path`, or (document_bytes > 0) its files' text joined in order into files of >= document_bytes each."""
  if document_bytes <= 0:
    return input_path
  folder.mkdir()
  _, files = corpus.resolve(input_path, field="--input")
  pending, size, count = [], 0, 0
  for index, file in enumerate(files):
    pending.append(file.read_bytes())
    size += len(pending[-1])
    if size >= document_bytes or index == len(files) - 1:
      (folder / f"document-{count:05d}.txt").write_bytes(b"".join(pending))
      pending, size, count = [], 0, count + 1
  print(f"input joined into {count:,} documents of >= {document_bytes:,} bytes (the last one may be shorter)",
        flush=True)
  return str(folder)


def _row(name: str, loaded: corpus.Corpus, manifest: dict | None, run_cfg, bench: LoaderBenchConfig,
         consumed: float) -> dict:
  per_learner = run_cfg.data.batch_size // run_cfg.learners
  seq_len = run_cfg.data.seq_len
  iterators = [shards.ShardIterator(loaded.train, batch_size=per_learner, seq_len=seq_len, num_shards=run_cfg.learners,
                                    shard_index=m, seed=run_cfg.seed) for m in range(run_cfg.learners)]
  start = time.perf_counter()
  for _ in range(bench.batches):
    for iterator in iterators:
      next(iterator)
  served = bench.batches * len(iterators) * per_learner * seq_len / (time.perf_counter() - start)
  service = DataService(loaded.train, seq_len=seq_len, seed=run_cfg.seed)
  start = time.perf_counter()
  for _ in range(bench.batches * len(iterators)):
    service.windows(service.lease(per_learner))
  leased = bench.batches * len(iterators) * per_learner * seq_len / (time.perf_counter() - start)
  prep = {}
  if manifest is not None:
    tokens = sum(manifest["splits"][s]["tokens"] for s in ("train", "eval"))
    prep = {"prepare MB/s": manifest["input"]["bytes"] / 1e6 / manifest["seconds"],
            "prepare tokens/s": tokens / manifest["seconds"]}
  return {"source": name, **prep, "shards tokens/s": served, "service tokens/s": leased,
          "learners tokens/s": consumed, "loader / learners": min(served, leased) / consumed,
          "target": f">= {TARGET:g}", "met": "yes" if min(served, leased) >= TARGET * consumed else "no"}
