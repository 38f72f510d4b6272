"""The modes behind the launchers: one run in the mode its config names, or several side by side."""

import dataclasses
import json
import os
import pathlib

import ml_collections
from absl import logging

from runtime.cluster import devices as devices_lib
from runtime.cluster import multislice
from runtime.reporting import provenance
from runtime import run_lock
from runtime.reporting import metrics
from runtime.reporting import summary
from runtime.config.run import RunConfig, from_config_dict, with_mode
from runtime.train import tree_transfer
from runtime.train.harness import Experiment, RunResult, finish
from runtime.trained import saved


def prepare(config: ml_collections.ConfigDict) -> RunConfig:
  """Validates the config and sets up simulated devices before JAX starts a backend."""
  run = from_config_dict(config)
  multislice.start_backend(run.backend)
  devices_lib.configure_simulated_devices(max(run.num_devices, run.syncer.shards))  # (on accelerators: host CPUs)
  devices_lib.configure_compilation_cache(run.compile_cache)
  return run


def train_one(run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str) -> RunResult:
  """Trains one run in the mode its config names, in `workdir/name` (see provenance.claim); run.json first."""
  if workdir is None:
    return _train_in(run, exp, workdir, name)
  resumable = run.checkpoints
  name, lock = provenance.claim(workdir, name, run, resumable=resumable)
  try:
    provenance.write(run, pathlib.Path(workdir) / name, name, host_transfers=tree_transfer.route(run.host_transfers))
    result = _train_in(run, exp, workdir, name)
    saved.save(pathlib.Path(workdir) / name / saved.MODEL_DIR, run, result.params, run_name=name,
               tokens=result.tokens, eval_loss=result.final_eval_loss)
    run_lock.write_atomically(pathlib.Path(workdir) / name / provenance.RESULT_JSON, lambda tmp: tmp.write_text(
        json.dumps(dict(row=result.row(), time_kind=result.time_kind), indent=1, allow_nan=True) + "\n"))
    return result
  finally:
    lock.release()


def _train_in(run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str) -> RunResult:
  if run.mode == "dp":
    from runtime.baselines.dp import train_dp  # pylint: disable=g-import-not-at-top
    return train_dp(run, exp, workdir, name)
  if run.mode in ("dp_elastic", "dp_restart"):
    from runtime.baselines.dp_faults import train_dp_under_faults  # pylint: disable=g-import-not-at-top
    return train_dp_under_faults(run, exp, workdir, name)
  from runtime.diloco.controller import train_diloco  # pylint: disable=g-import-not-at-top
  return train_diloco(run, exp, workdir, name)


def _report(results: list[RunResult], workdir: str | os.PathLike | None, title: str,
            loss_unit: str = "nats/byte") -> None:
  """Prints the summary table and where every output went; writes results.json last."""
  if workdir is None:
    print(finish(results, workdir, title=title, loss_unit=loss_unit))
    return
  out = pathlib.Path(workdir)
  with run_lock.outputs_of(out):  # the files describe every finished run in the workdir, whoever writes last
    everything = [*earlier_runs(out, {r.run for r in results}), *results]
    print(finish(everything, workdir, title=title, loss_unit=loss_unit))
    rows = json.dumps([r.row() for r in everything], indent=2, allow_nan=True) + "\n"
    run_lock.write_atomically(out / summary.RESULTS_FILE, lambda tmp: tmp.write_text(rows))
  print(outputs(results, out))


def earlier_runs(workdir: pathlib.Path, besides: set[str]) -> list[RunResult]:
  """The finished runs in `workdir` other than `besides`, oldest first, as their result.json and metrics.jsonl hold
  them; one whose files are damaged is left out of the summary with a line saying so (nothing of it is changed)."""
  found = []
  for path in workdir.glob(f"*/{provenance.RESULT_JSON}"):
    if path.parent.name in besides:
      continue
    try:
      result = json.loads(path.read_text(encoding="utf-8"))
      records = metrics.read_jsonl(path.parent / metrics.JSONL_NAME)
      found.append((path.stat().st_mtime, RunResult.from_row(result["row"], records, result["time_kind"])))
    except (OSError, ValueError, KeyError, TypeError) as error:  # (DataError is a ValueError)
      print(f"{path.parent}: left out of the workdir's summary: {path.name} or its metrics are damaged ({error}); "
            "the run's own files are unchanged", flush=True)
  return [result for _, result in sorted(found, key=lambda pair: pair[0])]


def outputs(results: list[RunResult], workdir: pathlib.Path) -> str:
  """Where a job's files are and what each holds."""
  files = [("summary.txt, summary.md, results.json", "the table above (text, Markdown, JSON)"),
           ("loss.png", "loss of every run against tokens and modeled (or wall) time")]
  if (workdir / "timeline.png").exists():
    files.append(("timeline.png", "each learner's state and the merges over time"))
  for r in results:
    files += [(f"{r.run}/metrics.jsonl", "every record (train, merge, eval, fault), one JSON object per line"),
              (f"{r.run}/run.json", "resolved config, seed, versions, devices, command line")]
    if (workdir / r.run / saved.MODEL_DIR / saved.MODEL_JSON).exists():
      files.append((f"{r.run}/{saved.MODEL_DIR}/", "the trained model: runtime.load_model, launch.sample, launch.evaluate"))
    if (workdir / r.run / "tb").exists():
      files.append((f"{r.run}/tb/", "TensorBoard events"))
  width = max(len(name) for name, _ in files)
  lines = [f"outputs in {workdir}/:", *(f"  {name.ljust(width)}  {what}" for name, what in files)]
  if any((workdir / r.run / "tb").exists() for r in results):
    lines.append(f"view in TensorBoard: tensorboard --logdir {workdir}")
  return "\n".join(lines)


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None,
          name: str | None = None) -> list[RunResult]:
  """`launch.train`: one run (named `name`, default its mode), then its summary table and loss plot."""
  run = prepare(config)
  exp = Experiment(run)
  result = train_one(run, exp, workdir, name or run.mode)
  _report([result], workdir, f"{name or run.mode}: {run.token_budget:,} tokens", exp.loss_unit)
  return [result]


def _titled(title: str, varied: str) -> str:
  return f"{title} ({varied})" if varied else title


def compare(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None,
            modes: tuple[str, ...] = ("dp", "diloco_sync", "decoupled"), varied: str = "") -> list[RunResult]:
  """`launch.compare`: the same budget, data and model under each mode; one table, one plot.

  `varied` names the fields set on the command line; it goes into the table's title.
  """
  base = prepare(config)
  exp = Experiment(base)
  results = []
  for mode in modes:
    run = with_mode(base, mode)
    logging.info("comparison: running %s", mode)
    results.append(train_one(run, exp, workdir, mode))
  _report(results, workdir, _titled(f"equal budget: {base.token_budget:,} tokens", varied), exp.loss_unit)
  return results


def chaos(config: ml_collections.ConfigDict, workdir: str | os.PathLike | None, varied: str = "") -> list[RunResult]:
  """`launch.chaos`: Decoupled DiLoCo, elastic DP and DP on one fault trace, plus a failure-free run.

  Under the real clock the trace's times are wall seconds (scaled by faults.time_scale) and every mode's failures
  are device errors of its running programs (runtime/baselines/job_time.py).
  """
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
                         pathlib.Path(workdir) / "timeline.png", time_kind=results[0].time_kind,
                         title="Decoupled DiLoCo under faults")
  _report(results, workdir, _titled(f"same fault trace, {base.token_budget:,}-token budget", varied),
          exp.loss_unit)
  return results
