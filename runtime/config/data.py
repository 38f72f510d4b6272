"""The data section of a run's config, and its rules (the corpus, its windows, how learners get them)."""

import dataclasses

from runtime.data import manifest as data_manifest
from runtime.data.shards import SHARD_LAYOUTS
from runtime.errors import check

ASSIGNMENTS = ("shards", "service")  # how learners get their data


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Corpus and batching."""

  path: str = "stdlib"
  eval_fraction: float = 0.02
  max_bytes: int | None = None
  seq_len: int = 128
  batch_size: int = 32  # global: summed over all learners / all devices
  prefetch: int = 2
  learner_batches: tuple[int, ...] = ()  # per-learner batch sizes summing to batch_size; empty = equal shares
  shard_layout: str = "strided"  # "strided" (each shard spans the corpus) or "contiguous" (a span of files)
  # "shards": learner m trains on shard m of M (layout above); "service": the controller leases windows of one
  # global stream on demand, independent of M (learners may join and leave: needed by capacity.schedule).
  assignment: str = "shards"


def validate(run) -> None:
  """Raises ConfigError on the first data field outside what it allows (model.vocab_size is the data's)."""
  m, d = run.model, run.data
  vocab, why = data_manifest.vocabulary(d.path)
  check(m.vocab_size == vocab, "model.vocab_size", m.vocab_size, f"{vocab} ({why})")
  check(d.seq_len >= 1, "data.seq_len", d.seq_len, "an integer >= 1")
  check(d.seq_len <= m.max_len, "data.seq_len", d.seq_len, f"<= model.max_len ({m.max_len})")
  check(0.0 < d.eval_fraction < 1.0, "data.eval_fraction", d.eval_fraction, "a float in (0, 1)")
  check(d.max_bytes is None or d.max_bytes > 0, "data.max_bytes", d.max_bytes, "None or a positive integer")
  check(d.prefetch >= 1, "data.prefetch", d.prefetch, "an integer >= 1")
  check(d.shard_layout in SHARD_LAYOUTS, "data.shard_layout", d.shard_layout, f"one of {SHARD_LAYOUTS}")
  check(d.assignment in ASSIGNMENTS, "data.assignment", d.assignment, f"one of {ASSIGNMENTS}")
  check(d.assignment == "shards" or run.mode in ("decoupled", "diloco_sync"), "data.assignment", d.assignment,
        f"'shards' in mode '{run.mode}' (the data service feeds DiLoCo learners: modes decoupled, diloco_sync)")
