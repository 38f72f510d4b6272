"""Benchmark: does dispatching a learner's part return before the part ends? On one simulated CPU device and on two,
with and without the crash check that fault injection adds (a host callback: at every inner step on two or more
devices, at the part's end on one).

The part is the learners' own round program (`runtime/diloco/learner/placement.py`, `programs`) on the smoke config's
model, H inner steps on zero batches. For each case the table gives the median over `repeats` parts of the seconds
until the call returned (dispatch) and until the part's results were ready (part); dispatch / part near 1 means
the part ran on the calling thread: under the real clock, the controller's, which then handles nothing else.
"""

import dataclasses
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime.cluster import devices as devices_lib
from runtime.config.run import RunConfig
from runtime.diloco.learner import placement
from runtime.errors import ConfigError
from runtime.reporting.summary import summary_table

COLUMNS = ("devices", "crash_check", "dispatch_ms", "part_ms", "dispatch/part")


@dataclasses.dataclass(frozen=True)
class DispatchBenchConfig:
  devices: tuple[int, ...] = (1, 2)  # simulated CPU devices of the learner's mesh, one case each
  repeats: int = 5

  def __post_init__(self) -> None:
    if not self.devices or min(self.devices) < 1:
      raise ConfigError("devices", self.devices, "one or more integers >= 1")
    if self.repeats < 1:
      raise ConfigError("repeats", self.repeats, "an integer >= 1")


def measure(run: RunConfig, devices: int, checked: bool, repeats: int) -> dict:
  """One case's row: the learner's round program over `devices` devices, with the crash check or without."""
  mesh = devices_lib.slice_mesh(jax.devices()[:devices])
  round_program, _, init = placement.programs(run.model, run.inner, run.total_steps, 0 if checked else None, mesh,
                                              False)
  params = jax.device_put(lm.init_params(run.model, jax.random.key(0)),
                          lm.param_shardings(run.model, mesh, run.fsdp))
  state = init(params, 0)
  batches = jax.device_put(np.zeros((run.inner_steps, run.data.batch_size, run.data.seq_len + 1), np.int32),
                           NamedSharding(mesh, P(None, "data")))
  state = jax.block_until_ready(round_program(state, batches))[0]  # (compiles)
  dispatched, finished = [], []
  for _ in range(repeats):
    start = time.perf_counter()
    state, metrics = round_program(state, batches)
    dispatched.append(time.perf_counter() - start)
    jax.block_until_ready((state, metrics))
    finished.append(time.perf_counter() - start)
  dispatch, part = float(np.median(dispatched)), float(np.median(finished))
  return {"devices": devices, "crash_check": "yes" if checked else "no", "dispatch_ms": 1e3 * dispatch,
          "part_ms": 1e3 * part, "dispatch/part": dispatch / part}


def run(run_config: RunConfig, cfg: DispatchBenchConfig) -> list[dict]:
  """Every case; prints the table."""
  rows = [measure(run_config, n, checked, cfg.repeats) for n in cfg.devices for checked in (False, True)]
  print(summary_table(rows, COLUMNS, title=f"a learner's part of {run_config.inner_steps} inner steps: dispatch vs "
                                           f"completion on simulated CPU devices (median of {cfg.repeats})"))
  return rows


def main(config, workdir: None, cfg: DispatchBenchConfig) -> list[dict]:
  """`launch.bench_dispatch`: the config's devices simulated (at least the largest case's), then every case."""
  del workdir  # (it prints its table only)
  from runtime.experiments import modes  # pylint: disable=g-import-not-at-top
  config.num_devices = max(config.num_devices, *cfg.devices)
  return run(modes.prepare(config), cfg)
