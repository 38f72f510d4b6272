"""What every training mode shares: corpus, held-out batches, evaluation, logging, the final report."""

import dataclasses
import math
import os
import pathlib
import time
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from runtime.data import corpus as corpus_lib
from runtime.data import shards as data_lib
from runtime.data import tokenizers
from runtime.reporting import summary
from runtime.config.run import RunConfig
from runtime.reporting.metrics import MetricsLogger
from runtime.run_lock import write_atomically
from runtime.train.programs import make_eval

PyTree = Any


@dataclasses.dataclass(frozen=True)
class RunResult:
  """Outcome of one run, as reported in the summary table."""

  run: str
  mode: str
  tokens: int
  final_eval_loss: float
  wall_seconds: float
  virtual_seconds: float
  tokens_per_second: float
  records: list = dataclasses.field(repr=False, default_factory=list)
  params: Any = dataclasses.field(repr=False, default=None)  # final (global) parameters
  extras: dict = dataclasses.field(default_factory=dict)  # more summary-table columns
  details: dict = dataclasses.field(repr=False, default_factory=dict)  # per-learner figures, not tabulated
  time_kind: str = "modeled"  # what its records' `time` measures: "modeled" or "wall" seconds

  def row(self) -> dict:
    """One line of the summary table."""
    return dict(run=self.run, mode=self.mode, tokens=self.tokens, eval_loss=self.final_eval_loss,
                wall_s=self.wall_seconds, modeled_s=self.virtual_seconds, tokens_per_wall_s=self.tokens_per_second,
                **self.extras)

  @classmethod
  def from_row(cls, row: dict, records: list, time_kind: str) -> "RunResult":
    """A finished run read back: its summary row, its records and what their `time` measures."""
    named = ("run", "mode", "tokens", "eval_loss", "wall_s", "modeled_s", "tokens_per_wall_s")
    return cls(run=row["run"], mode=row["mode"], tokens=row["tokens"], final_eval_loss=row["eval_loss"],
               wall_seconds=row["wall_s"], virtual_seconds=row["modeled_s"], tokens_per_second=row["tokens_per_wall_s"],
               records=records, extras={k: v for k, v in row.items() if k not in named}, time_kind=time_kind)


class Experiment:
  """Loads the corpus once and provides shards, held-out batches and a jitted evaluator."""

  def __init__(self, run: RunConfig):
    self.run = run
    self.corpus = corpus_lib.load_corpus(run.data.path, run.data.eval_fraction, run.data.max_bytes)
    self.eval_batches_NxBxT = data_lib.eval_batches(
        self.corpus.eval, batch_size=run.eval_batch,
        seq_len=run.data.seq_len, num_batches=run.eval_batches)
    short = data_lib.short_of(self.eval_batches_NxBxT, run.eval_batches, run.eval_batch)
    if short:
      print(f"data.path = {run.data.path!r}: {short}", flush=True)
    tokenizer, _ = tokenizers.of_data(run.data.path)
    # What the loss is per: a byte (text read byte-level) or a token; with tokens, the held-out set's UTF-8 bytes
    # per token turn the loss into bits per byte, comparable across tokenizers.
    self.loss_unit = "nats/byte" if tokenizer.kind == "byte" else "nats/token"
    scored = self.eval_batches_NxBxT[..., 1:]
    self._bytes_per_token = (None if tokenizer.kind == "byte"
                             else float(tokenizer.byte_lengths()[scored].sum()) / max(scored.size, 1))
    self._evaluators: dict[Mesh, Callable] = {}

  def shard(self, shard_index: int, num_shards: int, batch_size: int) -> data_lib.ShardIterator:
    """The training stream's shard `shard_index` of `num_shards`."""
    return data_lib.ShardIterator(self.corpus.train, batch_size=batch_size, seq_len=self.run.data.seq_len,
                                  num_shards=num_shards, shard_index=shard_index, seed=self.run.seed,
                                  layout=self.run.data.shard_layout)

  def eval_fields(self, loss: float) -> dict:
    """An eval record's loss fields: `eval_loss` (in `loss_unit`), and for tokens also `eval_bits_per_byte`."""
    if self._bytes_per_token is None:
      return dict(eval_loss=loss)
    return dict(eval_loss=loss, eval_bits_per_byte=loss / math.log(2) / max(self._bytes_per_token, 1e-9))

  def evaluate(self, params: PyTree, mesh: Mesh) -> float:
    """Mean held-out loss of `params` computed on `mesh` (params must already live there)."""
    if mesh not in self._evaluators:
      batches = jax.device_put(self.eval_batches_NxBxT, NamedSharding(mesh, P()))
      fn = jax.jit(make_eval(self.run.model))
      self._evaluators[mesh] = lambda p: fn(p, batches)
    return float(self._evaluators[mesh](params))


def run_time_kind(run: RunConfig) -> str:
  """What a run's record `time` measures: modeled seconds (virtual clock) or wall seconds (real clock)."""
  return "modeled" if run.clock.kind == "virtual" else "wall"


def make_logger(run: RunConfig, workdir: str | os.PathLike | None, name: str,
                time_kind: str | None = None, resume_after: int | None = None,
                keep_records: int | None = None) -> MetricsLogger:
  """A metrics logger whose progress bar counts the run's token budget; `time_kind` defaults to the clock's.

  `resume_after`: tokens at the checkpoint the run resumes from (its records up to there are kept, or its first
  `keep_records` records).
  """
  return MetricsLogger(workdir, run=name, total_tokens=run.token_budget, progress=run.progress,
                       tensorboard=run.tensorboard, time_kind=time_kind or run_time_kind(run),
                       resume_after=resume_after, keep_records=keep_records)


def finish(results: list[RunResult], workdir: str | os.PathLike | None, title: str,
           loss_unit: str = "nats/byte") -> str:
  """Prints/writes the summary table and the loss plots (losses in `loss_unit`); returns the table text."""
  columns = list(dict.fromkeys(k for r in results for k in r.row()))
  table = summary.summary_table([r.row() for r in results], columns, title=title)
  if workdir is not None:
    out = pathlib.Path(workdir)
    out.mkdir(parents=True, exist_ok=True)
    markdown = summary.summary_table([r.row() for r in results], columns, markdown=True)
    write_atomically(out / "summary.txt", lambda tmp: tmp.write_text(table + "\n"))
    write_atomically(out / "summary.md", lambda tmp: tmp.write_text(markdown + "\n"))
    runs = {r.run: r.records for r in results}
    time_kinds = {r.time_kind for r in results}
    x = ("tokens", "time") if len(time_kinds) == 1 else ("tokens",)  # modeled and wall seconds share no axis
    write_atomically(out / "loss.png", lambda tmp: summary.plot_curves(
        runs, tmp, x=x, kinds=("train", "merge", "eval"), title=title, time_kind=results[0].time_kind,
        loss_unit=loss_unit))
  return table


class Stopwatch:
  """Wall-clock seconds since construction, plus `elapsed` seconds counted before (a resumed run's)."""

  def __init__(self, elapsed: float = 0.0):
    self._start = time.perf_counter() - elapsed

  def __call__(self) -> float:
    return time.perf_counter() - self._start


def host(x: Any) -> Any:
  """Explicit device-to-host pull of a metrics pytree, as numpy."""
  return jax.tree.map(np.asarray, jax.device_get(x))
