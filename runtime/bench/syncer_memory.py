"""Benchmark: the syncer's memory, measured on its real structures, and its merge time.

The syncer (runtime/diloco/sync/syncer.py) is built for a decoder of about `params` parameters (fp32 on the host CPU
device) and run in the steady state of quorum K = 1: M learners report in turn, each from the Θ it last received, so
they stand at M staggered versions. Each structure's bytes are counted by array identity (an array held by two
structures counts once, in the first): Θ, the outer momentum, Θ's history, the mirrors of Θ down (compression.down),
and the reports of a merge of all M on the host (what a merge with K = M lands there at once).
"""

import dataclasses
import statistics
import time
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np

from runtime.bench.merge import VOCAB, is_shape, transformer_shapes
from runtime.cluster import devices as devices_lib
from runtime.config.run import OUTER_GRAD_BASES, OuterConfig
from runtime.diloco.sync.messages import Report
from runtime.diloco.sync.shards import Shards
from runtime.diloco.sync.syncer import Syncer
from runtime.errors import ConfigError
from runtime.wire import codecs
from runtime.wire import payload as payload_lib
from runtime.wire.config import FORMATS, CompressionConfig
from runtime.wire.downlink import NO_MIRROR, Mirrors

PyTree = Any
STRUCTURES = ("theta", "momentum", "history", "mirrors", "reports")


@dataclasses.dataclass(frozen=True)
class SyncerBenchConfig:
  """The model size, the learners and the settings measured."""

  params: int = 4_000_000  # Model size the tensors total (real arrays: every structure is allocated).
  vocab: int = VOCAB  # Rows of the embedding, the largest tensor (a shard holds whole tensors).
  learners: int = 8  # M, reporting in turn with K = 1.
  down: str = "none"  # compression.down: "none" or a codec ("int8", "int4", ...): one mirror per learner.
  up: str = "none"  # compression.up: "none" (θ_m whole) or a codec (reports are payloads, kept as their bytes).
  base: str = "current"  # outer.outer_grad_base: "current" or "base" (a report measured from the Θ it started from).
  shards: int = 1  # syncer.shards: host CPU devices the syncer's tensors are split across.
  fragments: int = 1  # P: each report carries one fragment, in turn.
  rounds: int = 3  # Reports per learner before the count (the history fills in M merges).

  def __post_init__(self) -> None:
    for field in ("params", "vocab", "learners", "fragments", "rounds", "shards"):
      if getattr(self, field) < 1:
        raise ConfigError(field, getattr(self, field), "an integer >= 1")
    if self.base not in OUTER_GRAD_BASES:
      raise ConfigError("base", self.base, f"one of {OUTER_GRAD_BASES}")
    for field in ("down", "up"):
      if getattr(self, field) not in FORMATS:
        raise ConfigError(field, getattr(self, field), f"one of {FORMATS}")


@dataclasses.dataclass(frozen=True)
class SyncerBenchResult:
  """Bytes held by each structure, the model's parameters, the seconds of each merge, and the bytes on each shard."""

  config: SyncerBenchConfig
  num_params: int
  bytes: dict[str, int]
  merge_seconds: list[float]
  shard_bytes: list[int]  # all structures' bytes on each shard's device

  def per_param(self, structure: str | None = None) -> float:
    """Bytes per parameter of one structure, or of them all."""
    held = self.bytes[structure] if structure else sum(self.bytes.values())
    return held / self.num_params


def _model(params: int, vocab: int, seed: int = 0) -> PyTree:
  """A decoder's tensors of about `params` entries, random fp32 on the host CPU device."""
  rng, host = np.random.default_rng(seed), devices_lib.host_device()
  leaf = lambda shape: jax.device_put(rng.standard_normal(shape, np.float32) * 0.02, host)
  return jax.tree.map(leaf, transformer_shapes(params, vocab), is_leaf=is_shape)


def _held(trees: dict[str, list[Any]]) -> tuple[dict[str, int], dict[Any, int]]:
  """Bytes of each structure's arrays and payloads, each counted once (in the first structure that holds it), and
  the bytes on each device (payloads: on the host device)."""
  seen, held, on = set(), {}, {}
  for name, group in trees.items():
    held[name] = 0
    for x in (leaf for tree in group for leaf in jax.tree.leaves(tree)):
      if id(x) not in seen:
        seen.add(id(x))
        held[name] += x.nbytes
        device = next(iter(x.devices())) if isinstance(x, jax.Array) else devices_lib.host_device()
        on[device] = on.get(device, 0) + x.nbytes
  return held, on


def run(config: SyncerBenchConfig) -> SyncerBenchResult:
  """Runs K = 1 merges of M learners in turn until each has reported `rounds` times, then counts what is held."""
  m_count, theta = config.learners, _model(config.params, config.vocab)
  compression = CompressionConfig(up=config.up, down=config.down)
  shards = Shards(theta, [NamedSharding(devices_lib.slice_mesh([d]), P())
                          for d in devices_lib.host_devices(config.shards)])
  mirrors = Mirrors(compression, theta, shards) if config.down != "none" else None
  codec = codecs.Codec(compression, theta) if config.up != "none" else None
  outer = dataclasses.replace(OuterConfig(), quorum=1, outer_grad_base=config.base)
  syncer = Syncer(outer, theta, m_count, codec=codec, mirrors=mirrors, fragments=config.fragments, shards=shards)
  syncer.compile_merges()
  step = lambda tree: jax.tree.map(lambda x: x - 1e-3, tree)  # a learner's progress since its base (on each shard)
  encode = jax.jit(lambda base, local: codec.encode(jax.tree.map(jax.numpy.subtract, base, local))) if codec else None
  held = {m: (NO_MIRROR, 0) for m in range(m_count)}  # learner -> (mirror, version) of the Θ it holds
  seconds = []

  def report(m: int, n: int) -> Report:
    mirror, version = held[m]
    stub = Report(m, None, 1, 1, version, 0.0, 0.0, base_mirror=mirror)
    fragment, base = n % config.fragments, syncer.base(stub)
    if base is None:  # (a version whose tensors nothing reads: the learner's Θ is the one last sent it)
      base = syncer.params
    local = syncer.trees.part(step(base), fragment)
    stub = dataclasses.replace(stub, sent_at=float(n), fragment=fragment, total_steps=n)
    if codec is None:
      return dataclasses.replace(stub, params=local)
    on_learner = jax.device_get((base, local))  # (the learner quantizes on its slice)
    return dataclasses.replace(stub, payload=payload_lib.pack(jax.device_get(encode(*on_learner))))

  for n in range(config.rounds * m_count):
    m = n % m_count
    syncer.receive(report(m, n))
    start = time.perf_counter()
    result = syncer.compute(syncer.take_pending(), m_count)
    jax.block_until_ready(result.params)
    seconds.append(time.perf_counter() - start)
    syncer.commit(result, list(held.values()))
    answer = syncer.answer(Report(m, None, 1, 1, held[m][1], 0.0, 0.0, base_mirror=held[m][0]), "merged")
    syncer.adopted(m)
    held[m] = (answer.mirror, answer.version) if answer.payload is not None else (NO_MIRROR, answer.version)
  landed = [report(m, n) for n, m in enumerate(range(m_count))]  # a merge of all M, on the host at once
  mirrored = [tree for _, tree in syncer.mirrors._held.values()] if syncer.mirrors else []  # pylint: disable=protected-access
  history = [tree for tree in syncer._history.values() if tree is not None]  # pylint: disable=protected-access
  bytes_held, on = _held(dict(theta=[syncer.params], momentum=[syncer.opt_state], history=history, mirrors=mirrored,
                              reports=[syncer.land(r.params) if r.payload is None
                                       else np.frombuffer(r.payload.blob, np.uint8) for r in landed]))
  num_params = sum(x.size for x in jax.tree.leaves(theta))
  shard_bytes = [on.get(next(iter(sharding.device_set)), 0) for sharding in shards.shardings]
  return SyncerBenchResult(config, num_params, bytes_held, seconds, shard_bytes)


def table(results: list[SyncerBenchResult]) -> str:
  """A Markdown table: bytes per parameter by structure and in all, the merge time, and 9B × M extrapolated."""
  head = ("| M | up | down | base | P | S | params | " + " | ".join(STRUCTURES) + " | all (B/param) | largest shard "
          "(B/param) | merge ms (median) | 9B model (GB) |\n|" + "---|" * (11 + len(STRUCTURES)) + "\n")
  rows = []
  for r in results:
    c = r.config
    cells = [f"{r.per_param(s):.2f}" for s in STRUCTURES]
    rows.append(f"| {c.learners} | {c.up} | {c.down} | {c.base} | {c.fragments} | {c.shards} | {r.num_params:,} | " +
                " | ".join(cells) + f" | {r.per_param():.2f} | {max(r.shard_bytes) / r.num_params:.2f}"
                f" | {1e3 * statistics.median(r.merge_seconds[c.learners:]):.1f} | "
                f"{r.per_param() * 9e9 / 1e9:,.0f} |")
  return head + "\n".join(rows) + "\n"
