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

from runtime.config import RunConfig

_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "ml-collections", "absl-py", "numpy")
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


def write(run: RunConfig, run_dir: str | os.PathLike, name: str) -> pathlib.Path:
  """Writes `run_dir/run.json`: the run's name, seed, time model, full resolved config and environment."""
  path = pathlib.Path(run_dir) / "run.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  record = dict(name=name, mode=run.mode, seed=run.seed,
                time="modeled (virtual clock)" if run.clock.kind == "virtual" else "wall (real clock)",
                config=dataclasses.asdict(run), environment=environment())
  cpu = record["environment"]["backend"] == "cpu"
  record["environment"]["devices_used"] = run.num_devices if cpu else record["environment"]["device_count"]
  path.write_text(json.dumps(record, indent=2, allow_nan=True, default=str) + "\n")
  return path
