"""A run's checkpoints: saved asynchronously with orbax, verified by a digest of their files, restored newest first.

A save blocks only while orbax copies the arrays to host memory; the files are written in the background and
committed by orbax's atomic rename, so a save interrupted by a kill never appears as a checkpoint. As soon as it is
committed, each checkpoint gets `digest.sha256` (a SHA-256 over its files, computed off the caller's thread). The
newest `keep` are kept, and the newest verified one besides while a newer one waits for its digest (`_KeepVerified`).
Restoring takes the newest checkpoint whose digest matches its files and that loads; one without a digest (the run
stopped before it was verified), with a mismatch (truncated or overwritten files) or that fails to load is skipped
with a warning naming it, and the one before is tried. If checkpoints exist and none is sound, nothing is restored
and nothing moved: the run is refused (a fresh start must be asked for, with resume=False), never silently begun
again from step 0. One exception, what a run stopped by a signal says it will do: when none of them was ever
verified (every one lacks its digest, none is damaged), the run was stopped moments after its first commit, and it
starts from the beginning with a warning, the unverified ones kept aside.

`save` copies the arrays on the caller's thread (orbax's blocking part); `save_async` hands a function that gathers
the arrays and metadata to a saver thread, so the caller waits for nothing unless the previous save is still
gathering (then it waits for it: no save is ever skipped).

Orbax numbers its save operations with one counter per process and keys each save's background signals by it, so
two saves started at once from two threads (a checkpoint on the saver thread, a model on the controller's) can wait
on each other's signals until a 300 s timeout, or rename each other's temporary directories. `ORBAX_SAVES` makes
every orbax save of the process start one at a time; the writes still proceed in the background.
"""

import concurrent.futures
import dataclasses
import hashlib
import pathlib
import shutil
import threading
import time
from typing import Any, Callable

import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from runtime.checkpoint import storage
from runtime.train import preemption
from runtime.errors import DataError

DIGEST = "digest.sha256"
UNVERIFIED = "it has no digest (the run stopped before verifying it)"
COMMIT_POLL_SECONDS = 0.01  # how often the verifier looks for a save's commit
PyTree = Any
ORBAX_SAVES = threading.Lock()  # held while an orbax save starts (see above)


def _digest(step_dir: pathlib.Path) -> str:
  """SHA-256 over every file of a checkpoint (its relative path, then its bytes), in path order."""
  sha = hashlib.sha256()
  for path in sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != DIGEST):
    sha.update(path.relative_to(step_dir).as_posix().encode() + b"\0")
    with path.open("rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        sha.update(block)
  return sha.hexdigest()


def _handlers() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
  """Arrays as an uncompressed pytree (float weights barely compress; zstd costs CPU), meta as JSON."""
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  arrays = ocp.PyTreeCheckpointHandler(use_compression=False)
  registry.add("state", ocp.args.PyTreeSave, arrays)
  registry.add("state", ocp.args.PyTreeRestore, arrays)
  json_handler = ocp.JsonCheckpointHandler()
  registry.add("meta", ocp.args.JsonSave, json_handler)
  registry.add("meta", ocp.args.JsonRestore, json_handler)
  return registry


def problem(step_dir: pathlib.Path) -> str | None:
  """Why the checkpoint in `step_dir` cannot be trusted, or None."""
  digest = step_dir / DIGEST
  if not digest.exists():
    return UNVERIFIED
  if digest.read_bytes().strip() != _digest(step_dir).encode():  # (bytes: a damaged digest is a mismatch too)
    return "its files do not match their digest (truncated or corrupted)"
  return None


@dataclasses.dataclass(frozen=True)
class _Step:
  step: int  # (what the policy reads of orbax's checkpoint info)


class _KeepVerified:
  """Orbax's preservation policy here: the newest `keep` checkpoints, and the newest verified one besides while a
  newer one still waits for its digest. Orbax prunes as soon as a save commits, before its digest is written; a run
  killed then (with keep=1, its only checkpoint unverified) would otherwise have nothing to resume from."""

  def __init__(self, directory: pathlib.Path, keep: int):
    self._directory, self._keep = directory, keep

  def should_preserve(self, checkpoints: list[Any], *, context: Any) -> list[bool]:
    del context
    steps = [c.step for c in checkpoints]
    newest = set(sorted(steps)[-self._keep:])
    verified = [s for s in steps if (self._directory / str(s) / DIGEST).exists()]
    newest |= {max(verified)} if verified else set()
    return [s in newest for s in steps]


def read(directory: pathlib.Path, step: int) -> tuple[dict[str, np.ndarray], dict]:
  """The arrays (NumPy, by key) and metadata of checkpoint `step` under `directory`, read without changing
  anything there (a running run's directory included); DataError if it is missing or not sound."""
  directory = pathlib.Path(directory).resolve()  # (orbax reads only absolute paths)
  steps = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []
  if step not in steps:
    raise DataError(f"no checkpoint {step} under {directory}: allowed one of {steps}" if steps else
                    f"no checkpoints under {directory} (the run saved none: --config.checkpoint_every)")
  why = problem(directory / str(step))
  if why is not None:
    raise DataError(f"checkpoint {directory / str(step)} cannot be read: {why}")
  options = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False)
  with ocp.CheckpointManager(directory, handler_registry=_handlers(), options=options) as manager:
    meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    like = {k: np.empty(shape, dtype) for k, (shape, dtype) in meta["arrays"].items()}
    arrays = manager.restore(step, args=ocp.args.Composite(state=restore_args(like))).state
  return arrays, meta


def restore_args(like: PyTree) -> ocp.args.PyTreeRestore:
  """Restores arrays shaped, typed and placed like `like`'s (NumPy arrays restore as NumPy arrays)."""
  return ocp.args.PyTreeRestore(item=like, restore_args=ocp.checkpoint_utils.construct_restore_args(like))


class Checkpoints:
  """The checkpoints of one run under `directory`, the newest `keep` of them kept (and the newest verified one while
  a newer one is being verified)."""

  def __init__(self, directory: str | pathlib.Path, keep: int = 3, resumable: bool = True):
    self.directory = pathlib.Path(directory).resolve()
    if self.directory.exists() and not self.directory.is_dir():
      raise DataError(f"{self.directory} is not a directory of checkpoints (a file is there): move it aside, and the "
                      "run starts or resumes with a checkpoints directory of its own")
    self._policy = _KeepVerified(self.directory, keep)
    self._manager = ocp.CheckpointManager(
        self.directory, handler_registry=_handlers(),
        options=ocp.CheckpointManagerOptions(preservation_policy=self._policy, enable_async_checkpointing=True,
                                             cleanup_tmp_directories=True))
    self._verifier = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-digest")
    self._saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-save")
    self._gathering: concurrent.futures.Future | None = None  # the save_async in progress
    self._digests: list[concurrent.futures.Future] = []
    self.blocking_seconds: list[float] = []  # per save: how long the caller waited
    self._closed = False
    if resumable:  # a second signal says what a run stopped now resumes from (not a store of restarts within a run)
      preemption.watch(self.on_disk)

  def on_disk(self) -> str:
    """What a run stopped now would resume from: the newest checkpoint here that is verified (has its digest; restore
    takes no other), or none (one line). Cheap enough for a signal handler: the digests are not recomputed."""
    verified = [int(p.name) for p in self.directory.glob("*") if p.name.isdigit()
                and (p / DIGEST).exists()] if self.directory.is_dir() else []
    if not verified:
      return f"no checkpoint under {self.directory} is verified yet: run again, it starts from the beginning"
    return f"checkpoint {max(verified)} under {self.directory} is the newest verified: run again to resume from it"

  def save(self, step: int, state: PyTree, meta: dict) -> None:
    """Starts saving `state` (arrays) and `meta` (JSON) as checkpoint `step`; returns once the arrays are copied."""
    start = time.perf_counter()
    self._save(step, state, meta)
    self.blocking_seconds.append(time.perf_counter() - start)

  def save_async(self, step: int, gather: Callable[[], tuple[PyTree, dict]]) -> None:
    """Saves checkpoint `step` from `gather()` = (arrays, meta), called on the saver thread.

    Returns at once unless the previous save is still gathering (which includes orbax waiting for the write
    before it to finish); an error of an earlier save is raised here.
    """
    start = time.perf_counter()
    if self._gathering is not None:
      self._gathering.result()
    self._gathering = self._saver.submit(lambda: self._save(step, *gather()))
    self.blocking_seconds.append(time.perf_counter() - start)

  def _save(self, step: int, state: PyTree, meta: dict) -> None:
    # The checkpoint before is verified first, so the preservation policy, consulted as this save begins, keeps it
    # (not an older one) while this one waits for its digest.
    concurrent.futures.wait(self._digests)
    with ORBAX_SAVES:
      saved = self._manager.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state),
                                                               meta=ocp.args.JsonSave(meta)))
    if not saved:
      raise RuntimeError(f"checkpoint {self.directory / str(step)} was not saved: steps must exceed the newest, "
                         f"{self._manager.latest_step()}")
    self._digests = [*(d for d in self._digests if not d.done() or d.exception()), self._verifier.submit(
        self._digest_when_committed, step)]

  def _digest_when_committed(self, step: int) -> None:
    """On the verifier thread: waits for checkpoint `step`'s background write to commit (renamed to its step), then
    writes its digest; returns without one if the write ends otherwise (its error is raised by `flush`)."""
    committed = lambda: (self.directory / str(step) / "commit_success.txt").exists()
    while not committed():
      if not self._manager.is_saving_in_progress() and not committed():
        return
      time.sleep(COMMIT_POLL_SECONDS)
    step_dir = self.directory / str(step)
    try:
      tmp = step_dir / f"{DIGEST}.tmp"
      tmp.write_text(_digest(step_dir) + "\n")
      tmp.rename(step_dir / DIGEST)
    except FileNotFoundError:
      pass  # removed by max_to_keep meanwhile

  def flush(self) -> None:
    """Waits until every save so far is written and verified (raises a failed save's error)."""
    if self._gathering is not None:
      self._gathering.result()
    self._manager.wait_until_finished()
    digests, self._digests = self._digests, []
    for digest in digests:
      digest.result()
    self._prune()

  def _prune(self) -> None:
    """Deletes what the preservation policy no longer keeps now that every save is verified (the newest verified
    one it kept while a newer one waited for its digest)."""
    steps = sorted(self._manager.all_steps())
    kept = self._policy.should_preserve([_Step(s) for s in steps], context=None)
    for step, keep in zip(steps, kept):
      if not keep:
        self._manager.delete(step)

  def close(self, quiet: bool = False) -> None:
    """Waits for the saves in progress and verifies them; `quiet` (closing after a failure) logs their errors. Once
    closed, closing again does nothing."""
    if self._closed:
      return
    self._closed = True
    try:
      self.flush()
    except Exception as error:  # pylint: disable=broad-except
      if not quiet:
        raise
      if storage.os_error_in(error) is None:  # (a storage error is the run's own, reported once)
        logging.error("checkpoints under %s: a save failed while the run was failing: %s", self.directory, error)
    finally:
      try:
        self._saver.shutdown(wait=True)
        self._verifier.shutdown(wait=True)
        self._manager.close()
      except Exception:  # pylint: disable=broad-except
        if not quiet:
          raise
      finally:
        preemption.unwatch(self.on_disk)
        if quiet:  # a save the failure interrupted leaves its temporary directory: never a checkpoint, removed
          for unfinished in self.directory.glob("*.orbax-checkpoint-tmp*"):
            shutil.rmtree(unfinished, ignore_errors=True)

  def steps(self) -> list[int]:
    """The committed checkpoints, newest first."""
    return sorted(self._manager.all_steps(), reverse=True)

  def problem(self, step: int) -> str | None:
    """Why checkpoint `step` cannot be trusted, or None."""
    return problem(self.directory / str(step))

  def restore_latest(self, like: PyTree | Callable[[dict], PyTree]) -> tuple[int, PyTree, dict] | None:
    """(step, state, meta) of the newest sound checkpoint, or None if there is none; DataError listing each one
    and why it was rejected if there are checkpoints and none is sound.

    The state is shaped and sharded like `like`, or like `like(meta)` (numpy arrays restore as numpy arrays).
    Skipped checkpoints are moved aside to `<directory>.skipped/` (kept, not deleted), so that the resumed run
    saves those steps afresh.
    """
    skipped, found, reasons = [], None, []
    for step in self.steps():
      problem = self.problem(step)
      if problem is None:
        try:
          meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
          target = like(meta) if callable(like) else like
          state = self._manager.restore(step, args=ocp.args.Composite(state=restore_args(target))).state
          found = step, state, meta
          break
        except Exception as error:  # pylint: disable=broad-except
          problem = f"it failed to load ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
      logging.warning("checkpoint %s is skipped: %s; trying the one before", self.directory / str(step), problem)
      skipped.append(step)
      reasons.append(problem)
    if found is None and skipped and set(reasons) == {UNVERIFIED}:  # never verified: it starts afresh (module doc)
      logging.warning("no checkpoint under %s was ever verified (%s): the run starts from the beginning; they are "
                      "kept aside under %s.skipped", self.directory, ", ".join(map(str, skipped)), self.directory.name)
    elif skipped and found is None:
      raise DataError(f"no sound checkpoint under {self.directory}: " +
                      "; ".join(f"{step} ({why})" for step, why in zip(skipped, reasons)) + "; nothing was restored "
                      "or changed; to start this run afresh deliberately, run with --config.resume=False")
    if skipped:
      aside = self.directory.with_name(self.directory.name + ".skipped")
      aside.mkdir(exist_ok=True)
      for step in skipped:
        target = aside / str(step)
        while target.exists():
          target = target.with_name(target.name + "+")
        (self.directory / str(step)).rename(target)
      self._manager.reload()
    return found
