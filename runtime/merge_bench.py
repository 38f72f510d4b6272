"""Benchmark: the syncer's jitted RDA merge of M reports against a NumPy copy of the same bytes."""

import dataclasses
import statistics
import time
from typing import Any

import jax
import numpy as np

from runtime import merge
from runtime.errors import ConfigError

PyTree = Any

# GPT-2-small-like proportions; the width is solved for so the model has the requested size.
LAYERS = 12
VOCAB = 32_000


@dataclasses.dataclass(frozen=True)
class MergeBenchConfig:
  """What to merge and how often to time it."""

  params: int = 100_000_000  # Model size the tensor set is fitted to.
  learners: int = 8  # Reports merged at once (M).
  repeats: int = 3  # Timed runs of each side; the best is reported.
  embed_mean: bool = False  # Route the embedding to the plain mean, as the syncer may.
  seed: int = 0  # Seed of the random deltas.

  def __post_init__(self):
    for field in ("params", "learners", "repeats"):
      if getattr(self, field) < 1:
        raise ConfigError(field, getattr(self, field), "an integer >= 1")


@dataclasses.dataclass(frozen=True)
class MergeBenchResult:
  """Timings of one benchmark run, in seconds, with the bytes both sides read."""

  input_bytes: int
  merge_s: list[float]
  copy_s: list[float]

  @property
  def merge_bandwidth(self) -> float:
    """Returns the merge's input bytes per second in its best run."""
    return self.input_bytes / min(self.merge_s)

  @property
  def copy_bandwidth(self) -> float:
    """Returns the copy's input bytes per second in its best run."""
    return self.input_bytes / min(self.copy_s)

  @property
  def ratio(self) -> float:
    """Returns merge bandwidth over copy bandwidth."""
    return self.merge_bandwidth / self.copy_bandwidth


def transformer_shapes(params: int) -> dict[str, Any]:
  """Returns a decoder's tensor shapes, as a nested dict, totalling about `params` entries."""
  # Per layer: qkv (d, 3d), out (d, d), mlp (d, 4d) and (4d, d), two norm scales; so
  # params ~= 12 * LAYERS * d^2 + VOCAB * d. Round d to a multiple of 8 like real widths.
  a, b = 12 * LAYERS, VOCAB
  width = max(8, round((-b + (b * b + 4 * a * params) ** 0.5) / (2 * a) / 8) * 8)
  layer = {
      "attn": {"qkv": {"kernel": (width, 3 * width)}, "out": {"kernel": (width, width)}},
      "mlp": {"up": {"kernel": (width, 4 * width)}, "down": {"kernel": (4 * width, width)}},
      "norm_attn": {"scale": (width,)},
      "norm_mlp": {"scale": (width,)},
  }
  layers = {f"layer_{i:02d}": layer for i in range(LAYERS)}
  return {"params": {"embed": {"embedding": (VOCAB, width)}, **layers}}


def _is_shape(node: Any) -> bool:
  """Returns whether a node of a shape tree is a shape, i.e. a leaf."""
  return isinstance(node, tuple)


def random_deltas(shapes: dict[str, Any], learners: int, seed: int) -> list[PyTree]:
  """Returns one fp32 delta per learner, uniform in [-0.5, 0.5), on the host CPU device."""
  rng = np.random.default_rng(seed)
  cpu = jax.devices("cpu")[0]

  def leaf(shape: tuple[int, ...]) -> jax.Array:
    host = rng.random(shape, dtype=np.float32)
    host -= 0.5
    return jax.device_put(host, cpu)

  return [jax.tree.map(leaf, shapes, is_leaf=_is_shape) for _ in range(learners)]


def _timed(fn: Any) -> float:
  """Returns the seconds `fn()` takes."""
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def run(config: MergeBenchConfig) -> MergeBenchResult:
  """Times the merge and the copy, interleaved so both see the same load, and prints both."""
  shapes = transformer_shapes(config.params)
  deltas = random_deltas(shapes, config.learners, config.seed)
  steps = np.arange(config.learners) + 20
  weights = jax.device_put(merge.token_weight(steps * 65_536, steps), jax.devices("cpu")[0])
  mean_for = merge.is_embedding if config.embed_mean else None

  def merge_once() -> None:
    jax.block_until_ready(merge.merge(deltas, weights, method="rda", mean_for=mean_for))

  # np.asarray of a CPU jax.Array is a view, so the copy reads the very bytes the merge reads.
  sources = [np.asarray(leaf) for delta in deltas for leaf in jax.tree.leaves(delta)]
  targets = [np.empty_like(source) for source in sources]

  def copy_once() -> None:
    for source, target in zip(sources, targets):
      np.copyto(target, source)

  copy_once()  # Faults the copy's targets in, as the first merge does its buffers.
  compile_s = _timed(merge_once)
  merge_s, copy_s = [], []
  for _ in range(config.repeats):
    merge_s.append(_timed(merge_once))
    copy_s.append(_timed(copy_once))

  result = MergeBenchResult(sum(s.nbytes for s in sources), merge_s, copy_s)
  print(format_result(config, result, len(sources) // config.learners, compile_s))
  return result


def format_result(config: MergeBenchConfig, result: MergeBenchResult, tensors: int,
                  compile_s: float) -> str:
  """Returns the benchmark's report as printed lines."""
  params = result.input_bytes / 4 / config.learners
  route = "embedding by mean, rest by RDA" if config.embed_mean else "every tensor by RDA"
  lines = [
      f"merge bench: {params / 1e6:.1f}M params in {tensors} tensors x {config.learners} "
      f"learners = {result.input_bytes / 1e9:.2f} GB of fp32 inputs; {route}; "
      f"first merge (compile + run) {compile_s:.1f} s",
  ]
  for name, times, bandwidth in (("jitted merge", result.merge_s, result.merge_bandwidth),
                                 ("numpy copyto", result.copy_s, result.copy_bandwidth)):
    lines.append(f"  {name}: best {min(times) * 1e3:7.1f} ms  median "
                 f"{statistics.median(times) * 1e3:7.1f} ms  {bandwidth / 1e9:5.1f} GB/s  "
                 f"(runs: {', '.join(f'{t * 1e3:.0f}' for t in times)} ms)")
  lines.append(f"  merge_bw / copy_bw = {result.ratio:.2f} (target >= 0.5)")
  return "\n".join(lines)
