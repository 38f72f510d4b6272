"""Benchmark: what learners in Ray actors cost the controller, against learners in its process (`launch.bench_ray`).

Each cell runs the config (configs/smoke.py by default: its tiny model, one simulated CPU device per learner) under
the real clock with M learners, backend "local" or "ray", and reads its merge records after the first `skip` merges
(compiles and first rounds set aside). Per merge: the wall seconds, and the controller thread's CPU seconds
(`host_controller_cpu_s`); the reports' bytes per host second on their way up (the learners' `report` calls, where a
learner in an actor copies and sends its report, plus the merge worker's copy to the syncer's host), and Θ's bytes
per host second on its way down (the `deliver` calls, where an actor takes Θ from the object store, the worker's
laying-out of Θ on learners' slices, and the adoptions). Bytes are the payloads the links count (bytes_up and
bytes_down of the records). Round trips: the calls the controller made to the learners' actors and waited for (a
part's future, `part_done`, is not one), over the whole run, per merge. Each cell appends its row to the rows file
as it ends and is skipped when its row is there, so a study stopped part way goes on where it stopped.
"""

import dataclasses
import math
import os
from typing import Sequence

import ml_collections

from runtime.errors import ConfigError
from runtime.experiments.asynchrony import append_row, read_rows
from runtime.reporting.summary import summary_table
from runtime.reporting import provenance

BACKENDS = ("local", "ray")
COLUMNS = ("learners", "backend", "merges", "wall_ms_per_merge", "controller_cpu_ms_per_merge", "round_trips_per_merge",
           "report_MB_per_s", "theta_MB_per_s", "tokens_per_wall_s")


@dataclasses.dataclass(frozen=True)
class RayBenchConfig:
  learners: tuple[int, ...] = (4, 16)  # M, one cell per backend each
  backends: tuple[str, ...] = BACKENDS
  skip: int = 4  # first merges set aside (compiles, first rounds)

  def __post_init__(self) -> None:
    if not self.learners or min(self.learners) < 1:
      raise ConfigError("learners", self.learners, "one or more integers >= 1")
    if not self.backends or any(b not in BACKENDS for b in self.backends):
      raise ConfigError("backends", self.backends, f"one or more of {BACKENDS}")
    if self.skip < 0:
      raise ConfigError("skip", self.skip, "an integer >= 0")


def cell_config(config: ml_collections.ConfigDict, learners: int, backend: str) -> ml_collections.ConfigDict:
  """The config of one cell: M learners on a simulated device each, under the real clock, no checkpoints."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.learners, config.num_devices, config.backend = learners, learners, backend
  config.clock.kind, config.checkpoint_wall_seconds, config.progress = "real", 0.0, False
  return config


def row_of(learners: int, backend: str, records: Sequence[dict], skip: int, tokens_per_wall_s: float,
           calls: dict[str, int] | None = None) -> dict:
  """A cell's row from its merge records after the first `skip` (the bytes counted from the last one skipped);
  `calls`: the run's calls to actors by method (ray_learner.CALLS; None in process)."""
  merges = [r for r in records if r["kind"] == "merge"]
  if len(merges) < skip + 2:
    raise ValueError(f"{len(merges)} merges: too few to time after skipping {skip} (raise total_steps)")
  before, timed = merges[skip], merges[skip + 1:]
  total = lambda key: sum(r.get(key, 0.0) for r in timed)
  adopts = sum(0.0 if math.isnan(r.get("host_adopt_s", math.nan)) else r["host_adopt_s"] * r["num_merged"]
               for r in timed)  # (host_adopt_s is the mean adoption since the merge before)
  up, down = timed[-1]["bytes_up"] - before["bytes_up"], timed[-1]["bytes_down"] - before["bytes_down"]
  report_s = total("host_report_s") + total("host_report_copy_s")
  theta_s = total("host_deliver_s") + total("host_theta_copy_s") + adopts
  return dict(learners=learners, backend=backend, merges=len(timed),
              wall_ms_per_merge=1e3 * (timed[-1]["wall"] - before["wall"]) / len(timed),
              controller_cpu_ms_per_merge=1e3 * total("host_controller_cpu_s") / len(timed),
              round_trips_per_merge=(math.nan if calls is None else
                                     (sum(calls.values()) - calls.get("part_done", 0)) / len(merges)),
              report_MB_per_s=up / 1e6 / report_s if report_s else math.nan,
              theta_MB_per_s=down / 1e6 / theta_s if theta_s else math.nan,
              tokens_per_wall_s=tokens_per_wall_s, commit=provenance.git_commit())


def run(config: ml_collections.ConfigDict, rows_path: str | os.PathLike, cfg: RayBenchConfig,
        markdown: bool = False) -> list[dict]:
  """Every cell without a row in `rows_path`, each appended as it ends; prints and returns the table of the cells."""
  from runtime.experiments.modes import prepare, train_one  # pylint: disable=g-import-not-at-top
  from runtime.train.harness import Experiment  # pylint: disable=g-import-not-at-top
  cells = [(m, b) for m in cfg.learners for b in cfg.backends]
  done = {(r["learners"], r["backend"]) for r in read_rows(rows_path)}
  prepare(cell_config(config, max(cfg.learners), "local"))  # (simulated devices for the largest, before JAX starts)
  for m, backend in [c for c in cells if c not in done]:
    run_cfg = prepare(cell_config(config, m, backend))
    calls = _ray_calls() if backend == "ray" else None
    before = dict(calls or {})
    result = train_one(run_cfg, Experiment(run_cfg), None, f"M={m} {backend}")
    made = None if calls is None else {name: n - before.get(name, 0) for name, n in calls.items()}
    append_row(rows_path, row_of(m, backend, result.records, cfg.skip, result.tokens_per_second, made))
  rows = [r for r in read_rows(rows_path) if (r["learners"], r["backend"]) in cells]
  print(summary_table(rows, COLUMNS, title=None if markdown else f"learners in Ray actors vs in process: {rows_path}",
                      markdown=markdown))
  return rows


def _ray_calls() -> dict[str, int]:
  from runtime.diloco.learner import ray_learner  # pylint: disable=g-import-not-at-top  (ray: imported for its cells)
  return ray_learner.CALLS


def main(config: ml_collections.ConfigDict, workdir: None, rows_path: str, cfg: RayBenchConfig,
         markdown: bool = False) -> list[dict]:
  """`launch.bench_ray`."""
  del workdir  # (its runs keep no directory: the rows file holds what they measured)
  return run(config, rows_path, cfg, markdown)
