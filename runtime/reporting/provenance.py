"""What a run was: its resolved config and its environment, written beside its metrics as run.json."""

import dataclasses
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import socket
import subprocess
import sys
from typing import Any

import jax

from runtime.config.run import CONTENT_FIELDS, QUIET_FIELDS, RESUMABLE_FIELDS, RunConfig
from runtime.data import corpus
from runtime.errors import UsageError
from runtime.run_lock import RunLock, is_lock_file, write_atomically

_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "ml-collections", "absl-py", "numpy",
             "pathwaysutils")
_REPO = pathlib.Path(__file__).resolve().parent.parent
RUN_JSON = "run.json"  # what the run is: its config, its data's digest and size, its environment
RESULT_JSON = "result.json"  # its row of the summary table, written when it ends
_LEGACY_MODEL_JSON = "model/model.json"  # how a finished run showed it before result.json was written


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def git_commit() -> str | None:
  """The repository's commit (with '+dirty' for uncommitted changes), or None outside a git checkout."""
  try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True, text=True, timeout=5,
                            check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO, capture_output=True,
                           text=True, timeout=5, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return commit + ("+dirty" if dirty else "")


def environment() -> dict[str, Any]:
  """Versions, devices and the command line of this process."""
  devices = jax.devices()
  return dict(
      command=[sys.executable, *sys.argv], cwd=os.getcwd(), host=socket.gethostname(),
      started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      python=platform.python_version(), platform=platform.platform(), git_commit=git_commit(),
      packages={p: _version(p) for p in _PACKAGES}, backend=jax.default_backend(), device_count=len(devices),
      device_kind=devices[0].device_kind, xla_flags=os.environ.get("XLA_FLAGS", ""))


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(tree, dict):
    return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
  return {prefix.rstrip("."): tree}


def _config_json(run: RunConfig) -> dict:
  """The run's config as run.json holds it (tuples become lists)."""
  return json.loads(json.dumps(dataclasses.asdict(run), allow_nan=True, default=str))


def _next_free(workdir: pathlib.Path, name: str) -> str:
  n = 2
  while (workdir / f"{name}.{n}").exists():
    n += 1
  return f"{name}.{n}"


def claim(workdir: str | os.PathLike, name: str, run: RunConfig, resumable: bool) -> tuple[str, RunLock]:
  """The directory name `run` writes to under `workdir`, locked for this process (see run_lock); nothing there is
  ever overwritten by another run, and no unfinished run is ever started afresh unless asked.

  A run is found by its name. `name` is used if it is free, or if it holds this run and `resumable` (it resumes from
  its checkpoints): the configs are compared field by field, the fields that may change (RESUMABLE_FIELDS, and a
  dataset moved with its content unchanged) are taken and said, any other change is refused naming each field. A
  finished run that cannot resume is followed by a new one in the next free `name.2`, `name.3`, ... (said), and so is
  any run with `resume=False`; an unfinished one without checkpoints is refused.
  """
  workdir = pathlib.Path(workdir)
  lock = RunLock.take(workdir, name)  # before anything there is read
  run_dir = workdir / name
  try:
    for stale in run_dir.glob(".*.tmp*"):  # a file a killed process was writing atomically (this lock excludes others)
      if stale.is_file():
        stale.unlink()
    if not any(not is_lock_file(p) for p in run_dir.iterdir()):
      _say_renamed(workdir, name)
      return name, lock
    if not run.resume:
      return _beside(workdir, name, lock, "--config.resume=False asks for a new run")
    record = _record_of(run_dir)
    if record is None:
      return _beside(workdir, name, lock, "it holds no run.json (no run of this version made it)")
    taken, refused = differences(record, run)
    if refused:
      raise UsageError(f"--workdir={workdir}: run '{name}' there was trained with another config ("
                       + "; ".join(refused) + f"); to train this config as a new run, give it another name "
                       f"(launch.train --run_name=NAME) or another --workdir; to go on with '{name}', run it with its "
                       "own config")
    if resumable and _checkpointed(record):
      for line in taken:
        print(f"{name}: {line}", flush=True)
      return name, lock
    if finished(run_dir):
      return _beside(workdir, name, lock, f"it is finished and mode '{run.mode}' without checkpoints cannot resume")
    raise UsageError(f"--workdir={workdir}: run '{name}' there is unfinished and was not checkpointed (mode "
                     f"'{record['config'].get('mode')}', checkpoint_every, checkpoint_seconds and "
                     "checkpoint_wall_seconds 0 when it ran), so it "
                     "cannot resume; to start it over deliberately: "
                     "--config.resume=False (a new run beside it), or another run name or --workdir")
  except BaseException:
    lock.release()
    raise


def _checkpointed(record: dict) -> bool:
  """Whether the run `record` (a run.json) describes saved checkpoints: only then can it resume, whatever the new
  config asks (turning checkpoints on for a run that had none would start it over in its own directory)."""
  config = record["config"]
  return any(config.get(field) for field in ("checkpoint_every", "checkpoint_seconds", "checkpoint_wall_seconds"))


def _say_renamed(workdir: pathlib.Path, name: str) -> None:
  """Says so when an unfinished run from before runs were named by mode (its name the mode and every override,
  'decoupled,outer.quorum=2') sits beside the new run `name`: it is not resumed, and renaming it would."""
  for old in sorted(workdir.glob(f"{name},*")):
    if (old / RUN_JSON).exists() and not finished(old):
      print(f"{old} holds an unfinished run named the old way (mode and overrides); this run starts as "
            f"{workdir / name}. To resume that one instead, stop this, rename it to {workdir / name} and run again",
            flush=True)


def _beside(workdir: pathlib.Path, name: str, lock: RunLock, why: str) -> tuple[str, RunLock]:
  """A new run directory beside `name`, said with `why`."""
  lock.release()
  fresh = _next_free(workdir, name)
  print(f"{workdir / name} holds an earlier run and {why}: this run goes to {workdir / fresh}", flush=True)
  return fresh, RunLock.take(workdir, fresh)


def _record_of(run_dir: pathlib.Path) -> dict | None:
  """The run.json of `run_dir` (None if there is none); a damaged one is a one-line UsageError saying what to do."""
  path = run_dir / RUN_JSON
  if not path.exists():
    return None
  try:
    record = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
      raise ValueError("it holds no 'config' object")
  except (OSError, ValueError, UnicodeDecodeError) as error:
    raise UsageError(f"{path} is damaged ({error}): the run there cannot be checked against this config. Its "
                     f"checkpoints and model are untouched: move {run_dir} aside (or restore its run.json) to resume "
                     "it, or give this run another name or --workdir") from None
  return record


def finished(run_dir: pathlib.Path) -> bool:
  """Whether the run in `run_dir` ran to its end (it wrote its result, or, before results were kept, its model)."""
  return (run_dir / RESULT_JSON).exists() or (run_dir / _LEGACY_MODEL_JSON).exists()


def differences(record: dict, run: RunConfig) -> tuple[list[str], list[str]]:
  """How `run` differs from the run `record` (a run.json) describes: (changes a resume takes, each a line to say;
  changes that refuse it, each 'field: old there, new now'). A field the record predates counts at its default."""
  before, now, default = _flat(record["config"]), _flat(_config_json(run)), _flat(_config_json(RunConfig()))
  taken, refused = [], []
  for key in sorted(set(before) | set(now)):
    was, is_now = before.get(key, default.get(key)), now.get(key, default.get(key))
    if was == is_now or key in QUIET_FIELDS:
      continue
    if key in RESUMABLE_FIELDS:
      taken.append(f"{key} is now {is_now!r} (was {was!r})")
    elif key in CONTENT_FIELDS and record.get("data_digest") == corpus.content_digest(is_now):
      taken.append(f"the dataset moved: data.path {was!r} -> {is_now!r} holds the same data (digest "
                   f"{record['data_digest']}), resuming on it")
    else:
      refused.append(f"{key}: {was!r} there, {is_now!r} now" + (" (other data)" if key in CONTENT_FIELDS else ""))
  path = now.get("data.path")
  if before.get("data.path") == path and record.get("data_digest") not in (None, corpus.content_digest(path)):
    refused.append(f"data.path: the data at {path!r} changed since the run began (digest {record['data_digest']} "
                   f"there, {corpus.content_digest(path)} now)")
  return taken, refused


def write(run: RunConfig, run_dir: str | os.PathLike, name: str, host_transfers: str = "") -> pathlib.Path:
  """Writes `run_dir/run.json`: the run's name, seed, time model, full resolved config and environment (with the
  host-transfer route the controller's process takes, `host_transfers`, if given)."""
  path = pathlib.Path(run_dir) / RUN_JSON
  path.parent.mkdir(parents=True, exist_ok=True)
  digest, size = corpus.content_identity(run.data.path)
  record = dict(name=name, mode=run.mode, seed=run.seed,
                time="modeled (virtual clock)" if run.clock.kind == "virtual" else "wall (real clock)",
                config=_config_json(run), data_digest=digest, data_size=size, environment=environment())
  cpu = record["environment"]["backend"] == "cpu"
  record["environment"]["devices_used"] = run.num_devices if cpu else record["environment"]["device_count"]
  if host_transfers:
    record["environment"]["host_transfers"] = host_transfers
  text = json.dumps(record, indent=2, allow_nan=True, default=str) + "\n"
  write_atomically(path, lambda tmp: tmp.write_text(text))  # (a kill mid-write leaves the old one whole)
  return path
