"""The modes behind the launchers: one run in the mode its config names, or several side by side."""

import dataclasses
import os
import pathlib
import sys
from typing import Any, Callable

import ml_collections
from absl import logging

from runtime import devices as devices_lib
from runtime import summary
from runtime.config import RunConfig, from_config_dict, with_mode
from runtime.errors import TrainingDiverged
from runtime.experiment import Experiment, RunResult, finish


def cli(job: Callable[..., Any], *args: Any) -> None:
  """Runs a launcher's job; a run that diverged exits with its message (status 1), not a traceback."""
  try:
    job(*args)
  except TrainingDiverged as error:
    sys.exit(f"error: {error}")


def prepare(config: ml_collections.ConfigDict) -> RunConfig:
  """Validates the config and sets up simulated devices before JAX starts a backend."""
  run = from_config_dict(config)
  devices_lib.configure_simulated_devices(run.num_devices)
  devices_lib.configure_compilation_cache(run.compile_cache)
  return run


def train_one(run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str) -> RunResult:
  """Trains one run in the mode its config names."""
  if run.mode == "dp":
    from runtime.baselines.dp import train_dp  # pylint: disable=g-import-not-at-top
    return train_dp(run, exp, workdir, name)
  if run.mode in ("dp_elastic", "dp_restart"):
    from runtime.baselines.dp_faults import train_dp_under_faults  # pylint: disable=g-import-not-at-top
    return train_dp_under_faults(run, exp, workdir, name)
  from runtime.diloco.controller import train_diloco  # pylint: disable=g-import-not-at-top
  return train_diloco(run, exp, workdir, name)


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None) -> list[RunResult]:
  """`launch.train`: one run, then its summary table and loss plot."""
  run = prepare(config)
  result = train_one(run, Experiment(run), workdir, run.mode)
  print(finish([result], workdir, title=f"{run.mode}: {run.token_budget:,} tokens"))
  return [result]


def compare(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None,
            modes: tuple[str, ...] = ("dp", "diloco_sync", "decoupled")) -> list[RunResult]:
  """`launch.compare`: the same budget, data and model under each mode; one table, one plot."""
  base = prepare(config)
  exp = Experiment(base)
  results = []
  for mode in modes:
    run = with_mode(base, mode)
    logging.info("comparison: running %s", mode)
    results.append(train_one(run, exp, workdir, mode))
  print(finish(results, workdir, title=f"equal budget: {base.token_budget:,} tokens"))
  return results


def chaos(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None) -> list[RunResult]:
  """`launch.chaos`: Decoupled DiLoCo, elastic DP and DP on one fault trace, plus a failure-free run."""
  base = prepare(config)
  exp = Experiment(base)
  calm = dataclasses.replace(base, faults=dataclasses.replace(base.faults, schedule=(), mtbi_chip_seconds=0.0))
  runs = [("decoupled", with_mode(base, "decoupled")), ("dp_elastic", with_mode(base, "dp_elastic")),
          ("dp_restart", with_mode(base, "dp_restart")), ("decoupled_no_faults", calm)]
  results = []
  for name, run in runs:
    logging.info("chaos comparison: running %s", name)
    results.append(train_one(run, exp, workdir, name))
  if workdir is not None:
    details = results[0].details
    summary.plot_timeline(details["intervals"], [(t, "merge") for t in details["merge_times"]],
                         pathlib.Path(workdir) / "timeline.png", title="Decoupled DiLoCo under faults")
  print(finish(results, workdir, title=f"same fault trace, {base.token_budget:,}-token budget"))
  return results
