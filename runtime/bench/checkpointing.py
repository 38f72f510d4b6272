"""Benchmark: what checkpointing costs a real-clock Decoupled DiLoCo run.

Two contenders alternate in one process on the same config (by default the 100M-parameter model of the merge
benchmark): the run with a checkpoint every `seconds` (or `every` merges), into a fresh directory, and the same run
without. Reported per repeat: the controller's blocking time per periodic save (the snapshot of its state; the
arrays are gathered and written on the checkpoint thread) against the wall time between saves, the final save
(after training) apart, and the steady-state throughput of
each contender (merged tokens per second with every learner warm, as `launch.benchmark` measures it).
"""

import dataclasses
import math
import statistics
import tempfile

import jax
import ml_collections

from models import lm

from runtime.bench.throughput import alternate, diloco_tokens_per_second, format_result
from runtime.config.run import RunConfig, with_mode
from runtime.errors import ConfigError
from runtime.train.harness import Experiment
from runtime.config.faults import FaultConfig
from runtime.experiments.modes import prepare, train_one
from runtime.reporting.summary import summary_table

BLOCKING_TARGET = 0.05  # the controller's blocking time per save, as a fraction of the time between saves
THROUGHPUT_TARGET = 0.97  # throughput with checkpoints on / off


@dataclasses.dataclass(frozen=True)
class CheckpointBenchConfig:
  """How often each contender runs, how long, and how often the checkpointed one saves."""

  repeats: int = 3  # runs of each contender, alternating; median ratios are reported
  every: int = 0  # merges between checkpoints (0: by `seconds` only)
  seconds: float = 30.0  # wall seconds between checkpoints (0: by `every` only)
  skip_rounds: int = 1  # each learner's first rounds not timed (compilation)

  def __post_init__(self) -> None:
    for name in ("repeats", "skip_rounds"):
      if getattr(self, name) < 1:
        raise ConfigError(name, getattr(self, name), "an integer >= 1")
    if self.every < 0 or self.seconds < 0 or not (self.every or self.seconds):
      field, value = ("seconds", self.seconds) if self.seconds < 0 else ("every", self.every)
      raise ConfigError(field, value, "every >= 0 merges and seconds >= 0, not both 0")


def _checkpointed(run: RunConfig, exp: Experiment, skip_rounds: int, saves: list[dict]) -> float:
  """Tokens/s of the run with checkpoints into a fresh directory; appends its save figures to `saves`."""
  with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as workdir:
    result = train_one(run, exp, workdir, "decoupled")
  if "save_interval_s" not in result.extras:
    raise ValueError(f"{result.extras.get('checkpoints', 0)} periodic saves: lengthen the run or save more often")
  saves.append({k: result.extras[k] for k in ("checkpoints", "save_block_ms", "save_block_ms_max", "save_interval_s",
                                              "final_save_ms")})
  return diloco_tokens_per_second(result.records, skip_rounds)


def run(config: ml_collections.ConfigDict, bench: CheckpointBenchConfig) -> dict[str, float]:
  """Runs both contenders `bench.repeats` times; prints the tables and returns the median ratios."""
  base = prepare(config)
  base = with_mode(dataclasses.replace(
      base, progress=False, tensorboard=False, faults=FaultConfig(), eval_every=base.total_steps + 1,
      clock=dataclasses.replace(base.clock, kind="real")), "decoupled")
  exp = Experiment(base)
  on = dataclasses.replace(base, checkpoint_every=bench.every, checkpoint_seconds=bench.seconds)
  saves: list[dict] = []
  rows = alternate({"on": lambda: _checkpointed(on, exp, bench.skip_rounds, saves),
                    "off": lambda: diloco_tokens_per_second(train_one(base, exp, None, "decoupled").records,
                                                            bench.skip_rounds)}, bench.repeats)
  params = sum(math.prod(a.shape) for a in jax.tree.leaves(lm.abstract_params(base.model)))
  every = " or ".join(([f"{bench.every} merges"] if bench.every else []) + ([f"{bench.seconds:g} s"] if bench.seconds
                                                                            else []))
  title = (f"real-clock Decoupled DiLoCo (M={base.learners}, H={base.inner_steps}, {params / 1e6:.1f}M parameters, "
           f"global batch {base.data.batch_size} x {base.data.seq_len}, {base.total_steps} steps) with a checkpoint "
           f"every {every} vs without")
  throughput, throughput_median = format_result(f"throughput: {title}", rows, "on", "off", target=THROUGHPUT_TARGET)
  fractions = [s["save_block_ms"] / 1e3 / s["save_interval_s"] for s in saves]
  table = summary_table([{"repeat": i + 1, "saves": s["checkpoints"], "blocking ms (mean)": s["save_block_ms"],
                          "blocking ms (max)": s["save_block_ms_max"], "s between saves": s["save_interval_s"],
                          "blocking / between": f, "final save ms": s["final_save_ms"]}
                         for i, (s, f) in enumerate(zip(saves, fractions))],
                        ["repeat", "saves", "blocking ms (mean)", "blocking ms (max)", "s between saves",
                         "blocking / between", "final save ms"],
                        title=f"controller blocking per periodic save (the final save, after training, apart): {title}")
  blocking_median = statistics.median(fractions)
  print(f"{table}\nmedian blocking / time between saves = {blocking_median:.4f} "
        f"({'meets' if blocking_median <= BLOCKING_TARGET else 'misses'} the target <= {BLOCKING_TARGET})\n"
        f"{throughput}", flush=True)
  return dict(blocking=blocking_median, throughput=throughput_median)
