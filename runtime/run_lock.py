"""One process per run directory: an OS lock held for the run's life, released by the kernel if the process dies.

The lock is `fcntl.flock` on `<run>/.lock`, taken before anything in the directory is read or written; the file
names its holder (pid, host, since) for the refusal a second process prints. Workdir-level outputs (summary.*,
results.json, loss.png) are written as one set under `<workdir>/.outputs.lock`, each file through a temporary name
and a rename, so two invocations in one workdir never leave files that describe different sets of runs.
"""

import contextlib
import datetime
import fcntl
import json
import os
import pathlib
import socket
from typing import Callable, Iterator

from runtime.errors import UsageError

LOCK_FILE = ".lock"
OUTPUTS_LOCK = ".outputs.lock"


class RunLock:
  """The lock on one run directory, held until `release` (or the process's end)."""

  def __init__(self, run_dir: pathlib.Path, handle):
    self.run_dir, self._handle = run_dir, handle

  @classmethod
  def take(cls, workdir: pathlib.Path, name: str, kind: str = "run", flag: str = "--workdir") -> "RunLock":
    """Locks `workdir/name` (made if missing), or raises UsageError naming the process that holds it."""
    run_dir = workdir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / LOCK_FILE, "a+", encoding="utf-8")  # pylint: disable=consider-using-with
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.seek(0)
      holder = _holder(handle.read())
      handle.close()
      raise UsageError(f"{kind} '{name}' in {workdir} is in use by {holder}; wait for it, or use another "
                       f"{flag}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(dict(pid=os.getpid(), host=socket.gethostname(),
                                 since=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))))
    handle.flush()
    return cls(run_dir, handle)

  def release(self) -> None:
    if not self._handle.closed:
      fcntl.flock(self._handle, fcntl.LOCK_UN)
      self._handle.close()


def _holder(text: str) -> str:
  try:
    info = json.loads(text)
    return f"pid {info['pid']} on {info['host']} since {info['since']}"
  except (ValueError, KeyError, TypeError):
    return "another process (it has not named itself yet)"


def is_lock_file(path: pathlib.Path) -> bool:
  return path.name == LOCK_FILE


@contextlib.contextmanager
def outputs_of(workdir: pathlib.Path) -> Iterator[None]:
  """Holds the workdir's outputs lock (blocking: another invocation writing its set finishes first)."""
  workdir.mkdir(parents=True, exist_ok=True)
  with open(workdir / OUTPUTS_LOCK, "a", encoding="utf-8") as handle:
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomically(path: pathlib.Path, write: Callable[[pathlib.Path], None]) -> None:
  """`write(temporary path)`, then the temporary file renamed to `path` (readers see the old file or the new)."""
  tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
  try:
    write(tmp)
    os.replace(tmp, path)
  finally:
    tmp.unlink(missing_ok=True)
