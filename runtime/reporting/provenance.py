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

from runtime.config.run import QUIET_FIELDS, RunConfig
from runtime.errors import UsageError
from runtime.reporting.run_lock import RunLock, is_lock_file

_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "ml-collections", "absl-py", "numpy",
             "pathwaysutils")
_REPO = pathlib.Path(__file__).resolve().parent.parent


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def _git_commit() -> str | None:
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
      python=platform.python_version(), platform=platform.platform(), git_commit=_git_commit(),
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
  ever overwritten by another run.

  `name` if it is free, or if it holds this same run and `resumable` (the run resumes from its checkpoints). A
  different config there is refused, naming the fields that differ, and so is a run directory another process
  holds. With `resume=False`, or a run that cannot resume, the next free `name.2`, `name.3`, ... is used instead
  (and said).
  """
  workdir = pathlib.Path(workdir)
  lock = RunLock.take(workdir, name)  # before anything there is read
  run_dir = workdir / name
  if not any(not is_lock_file(p) for p in run_dir.iterdir()):
    return name, lock
  record = run_dir / "run.json"
  if run.resume and record.exists():
    old, new = _flat(json.loads(record.read_text())["config"]), _flat(_config_json(run))
    differ = [k for k in sorted(set(old) | set(new)) if k not in QUIET_FIELDS and old.get(k) != new.get(k)]
    if differ:
      lock.release()
      raise UsageError(f"--workdir={workdir}: run '{name}' there has a different config ("
                       + "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in differ[:8])
                       + (f"; and {len(differ) - 8} more" if len(differ) > 8 else "") + "); allowed the same config "
                       "(to resume it), --config.resume=False (a fresh run beside it) or another --workdir")
    if resumable:
      return name, lock
  lock.release()
  fresh = _next_free(workdir, name)
  why = "resume=False" if not run.resume else f"mode '{run.mode}' without checkpoints cannot resume"
  print(f"{run_dir} holds an earlier run and {why}: this run goes to {workdir / fresh}", flush=True)
  return fresh, RunLock.take(workdir, fresh)


def write(run: RunConfig, run_dir: str | os.PathLike, name: str) -> pathlib.Path:
  """Writes `run_dir/run.json`: the run's name, seed, time model, full resolved config and environment."""
  path = pathlib.Path(run_dir) / "run.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  record = dict(name=name, mode=run.mode, seed=run.seed,
                time="modeled (virtual clock)" if run.clock.kind == "virtual" else "wall (real clock)",
                config=_config_json(run), environment=environment())
  cpu = record["environment"]["backend"] == "cpu"
  record["environment"]["devices_used"] = run.num_devices if cpu else record["environment"]["device_count"]
  path.write_text(json.dumps(record, indent=2, allow_nan=True, default=str) + "\n")
  return path
