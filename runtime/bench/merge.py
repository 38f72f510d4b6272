"""Benchmark: the syncer's jitted RDA merge of M reports against a NumPy copy of the same bytes."""

from collections.abc import Callable
import dataclasses
import functools
import statistics
import time
from typing import Any
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from runtime.diloco.sync import averaging
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

  def __post_init__(self) -> None:
    for field in ("params", "learners", "repeats"):
      if getattr(self, field) < 1:
        raise ConfigError(field, getattr(self, field), "an integer >= 1")


COPY = "numpy copyto"
MERGE_DONATED = "merge, reports donated"
MERGE_FRESH = "merge, fresh output"


@dataclasses.dataclass(frozen=True)
class MergeBenchResult:
  """Seconds of each timed run of each side, by side, with the bytes every side reads."""

  input_bytes: int
  seconds: dict[str, list[float]]

  def bandwidth(self, side: str) -> float:
    """Returns a side's input bytes per second in its best run."""
    return self.input_bytes / min(self.seconds[side])

  def ratio(self, side: str) -> float:
    """Returns a side's bandwidth over the copy's."""
    return self.bandwidth(side) / self.bandwidth(COPY)


def transformer_shapes(params: int, vocab: int = VOCAB) -> dict[str, Any]:
  """Returns a decoder's tensor shapes, as a nested dict, totalling about `params` entries."""
  # Per layer: qkv (d, 3d), out (d, d), mlp (d, 4d) and (4d, d), two norm scales; so
  # params ~= 12 * LAYERS * d^2 + vocab * d. Round d to a multiple of 8 like real widths.
  a, b = 12 * LAYERS, vocab
  width = max(8, round((-b + (b * b + 4 * a * params) ** 0.5) / (2 * a) / 8) * 8)
  layer = {
      "attn": {"qkv": {"kernel": (width, 3 * width)}, "out": {"kernel": (width, width)}},
      "mlp": {"up": {"kernel": (width, 4 * width)}, "down": {"kernel": (4 * width, width)}},
      "norm_attn": {"scale": (width,)},
      "norm_mlp": {"scale": (width,)},
  }
  layers = {f"layer_{i:02d}": layer for i in range(LAYERS)}
  return {"params": {"embed": {"embedding": (vocab, width)}, **layers}}


def is_shape(node: Any) -> bool:
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

  return [jax.tree.map(leaf, shapes, is_leaf=is_shape) for _ in range(learners)]


def _timed(fn: Callable[[], Any]) -> float:
  """Returns the seconds `fn()` takes, waiting for any jax.Array it returns."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def run(config: MergeBenchConfig) -> MergeBenchResult:
  """Times both merges and the copy, interleaved so all see the same load, and prints them."""
  shapes = transformer_shapes(config.params)
  deltas = random_deltas(shapes, config.learners, config.seed)
  # Learners ran different step counts of equal 65,536-token batches.
  steps = np.arange(config.learners) + 20
  weights = jax.device_put(averaging.token_weight(steps * 65_536, steps), jax.devices("cpu")[0])
  merge_fn = functools.partial(averaging.merge, weights=weights, method="rda",
                               mean_for=averaging.is_embedding if config.embed_mean else None)
  # A syncer that drops the reports after merging can donate them; the output then reuses
  # their memory instead of faulting in fresh pages every round.
  donating = jax.jit(merge_fn, donate_argnames="deltas")

  def merge_donated() -> float:
    reports = jax.tree.map(jnp.copy, deltas)  # Fresh buffers to donate, made untimed.
    return _timed(lambda: donating(reports))

  def merge_fresh() -> float:
    return _timed(lambda: merge_fn(deltas))

  # np.asarray of a CPU jax.Array is a view, so the copy reads the very bytes the merges read.
  sources = [np.asarray(leaf) for delta in deltas for leaf in jax.tree.leaves(delta)]
  targets = [np.empty_like(source) for source in sources]

  def copy() -> float:
    return _timed(lambda: [np.copyto(target, source) for source, target in zip(sources, targets)])

  sides = {MERGE_DONATED: merge_donated, MERGE_FRESH: merge_fresh, COPY: copy}
  with warnings.catch_warnings():
    # Only one of the M reports per tensor can hold the output; the rest are freed unused.
    warnings.filterwarnings("ignore", "Some donated buffers were not usable")
    # The first runs compile the merges and fault in the copy's targets.
    warmup_s = {name: side() for name, side in sides.items()}
    seconds = {name: [] for name in sides}
    for _ in range(config.repeats):
      for name, side in sides.items():
        seconds[name].append(side())

  result = MergeBenchResult(sum(source.nbytes for source in sources), seconds)
  print(format_result(config, result, len(sources) // config.learners, warmup_s))
  return result


def format_result(config: MergeBenchConfig, result: MergeBenchResult, tensors: int,
                  warmup_s: dict[str, float]) -> str:
  """Returns the benchmark's report as printed lines."""
  params = result.input_bytes / 4 / config.learners
  route = "embedding by mean, rest by RDA" if config.embed_mean else "every tensor by RDA"
  lines = [f"merge bench: {params / 1e6:.1f}M params in {tensors} tensors x {config.learners} "
           f"learners = {result.input_bytes / 1e9:.2f} GB of fp32 inputs; {route}; token "
           f"weights; best of {config.repeats} runs"]
  for name, times in result.seconds.items():
    lines.append(f"  {name:22s} best {min(times) * 1e3:6.0f} ms  median "
                 f"{statistics.median(times) * 1e3:6.0f} ms  {result.bandwidth(name) / 1e9:5.1f} "
                 f"GB/s  runs {', '.join(f'{t * 1e3:.0f}' for t in times)} ms  (first run "
                 f"{warmup_s[name]:.1f} s)")
  for name in (MERGE_DONATED, MERGE_FRESH):
    lines.append(f"  merge_bw / copy_bw, {name}: {result.ratio(name):.2f} (target >= 0.5)")
  return "\n".join(lines)
