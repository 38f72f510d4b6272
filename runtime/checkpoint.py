"""A run's checkpoints: saved asynchronously with orbax, verified by a digest of their files, restored newest first.

A save blocks only while orbax copies the arrays to host memory; the files are written in the background and
committed by orbax's atomic rename, so a save interrupted by a kill never appears as a checkpoint. Once committed,
each checkpoint gets `digest.sha256` (a SHA-256 over its files, computed off the caller's thread). Restoring takes
the newest checkpoint whose digest matches its files and that loads; one without a digest (the run stopped before
it was verified), with a mismatch (truncated or overwritten files) or that fails to load is skipped with a warning
naming it, and the one before is tried.
"""

import concurrent.futures
import hashlib
import pathlib
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

DIGEST = "digest.sha256"
PyTree = Any


def _digest(step_dir: pathlib.Path) -> str:
  """SHA-256 over every file of a checkpoint (its relative path, then its bytes), in path order."""
  sha = hashlib.sha256()
  for path in sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != DIGEST):
    sha.update(path.relative_to(step_dir).as_posix().encode() + b"\0")
    with path.open("rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        sha.update(block)
  return sha.hexdigest()


class Checkpoints:
  """The checkpoints of one run under `directory`, the newest `keep` of them kept."""

  def __init__(self, directory: str | pathlib.Path, keep: int = 3):
    self.directory = pathlib.Path(directory).resolve()
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=("state", "meta"),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True,
                                             cleanup_tmp_directories=True))
    self._verifier = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-digest")
    self._unverified: list[int] = []
    self.blocking_seconds: list[float] = []  # per save: how long the caller waited

  def save(self, step: int, state: PyTree, meta: dict) -> None:
    """Starts saving `state` (arrays) and `meta` (JSON) as checkpoint `step`; returns once the arrays are copied."""
    start = time.perf_counter()
    self._verify_committed()
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     meta=ocp.args.JsonSave(meta)))
    self._unverified.append(step)
    self.blocking_seconds.append(time.perf_counter() - start)

  def _verify_committed(self) -> None:
    """Digests, off this thread, the checkpoints whose background write has committed (renamed to its step)."""
    committed = [s for s in self._unverified if (self.directory / str(s) / "commit_success.txt").exists()]
    for step in committed:
      self._verifier.submit(self._write_digest, step)
    self._unverified = [s for s in self._unverified if s not in committed]

  def _write_digest(self, step: int) -> None:
    step_dir = self.directory / str(step)
    if step_dir.is_dir():  # not already removed by max_to_keep
      tmp = step_dir / f"{DIGEST}.tmp"
      tmp.write_text(_digest(step_dir) + "\n")
      tmp.rename(step_dir / DIGEST)

  def close(self) -> None:
    """Waits for the saves in progress and verifies them."""
    self._manager.wait_until_finished()
    self._verify_committed()
    self._verifier.shutdown(wait=True)
    self._manager.close()

  def steps(self) -> list[int]:
    """The committed checkpoints, newest first."""
    return sorted(self._manager.all_steps(), reverse=True)

  def problem(self, step: int) -> str | None:
    """Why checkpoint `step` cannot be trusted, or None."""
    step_dir = self.directory / str(step)
    digest = step_dir / DIGEST
    if not digest.exists():
      return "it has no digest (the run stopped before verifying it)"
    if digest.read_text().strip() != _digest(step_dir):
      return "its files do not match their digest (truncated or corrupted)"
    return None

  def restore_latest(self, like: PyTree) -> tuple[int, PyTree, dict] | None:
    """(step, state shaped and sharded like `like`, meta) of the newest sound checkpoint, or None if none is."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    for step in self.steps():
      problem = self.problem(step)
      if problem is None:
        try:
          restored = self._manager.restore(step, args=ocp.args.Composite(
              state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
          return step, restored.state, restored.meta
        except Exception as error:  # pylint: disable=broad-except
          problem = f"it failed to load ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
      logging.warning("checkpoint %s is skipped: %s; trying the one before", self.directory / str(step), problem)
    return None
