"""Data-parallel baselines under the same fault trace, with real training steps, under either clock.

Both run synchronous steps over every healthy slice. Without elasticity, any failure stops the whole job: it loses
the steps since its last checkpoint, waits for a hot spare or the slice's repair, then pays a restart (the goodput
simulator's semantics, runtime/baselines/job_failures.py). Its checkpoints are real: saved with `Checkpoints` (orbax,
asynchronous) every `faults.restart_checkpoint_every` steps and restored from disk at each restart, whose wall time
is reported beside `faults.restart_seconds`. Elastic DP pays a short reconfiguration, continues on the surviving
slices with a smaller global batch, and pays it again when the slice returns. Under the virtual clock their time is
modeled; under the real clock it is wall time and a failure is a device error of the job's step program
(runtime/baselines/job_time.py).
"""

import contextlib
import os
import pathlib
import tempfile
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime.cluster import devices as devices_lib
from runtime.cluster import multislice
from runtime.checkpoint.store import Checkpoints
from runtime.config.run import RunConfig
from runtime.train.harness import Experiment, RunResult, Stopwatch, make_logger
from runtime.baselines import job_failures
from runtime.baselines import job_time
from runtime.faults import injection
from runtime.network import allreduce
from runtime.periodic import Marks, due
from runtime.train.optim import inner_lr, inner_optimizer
from runtime.train.programs import init_state, make_train_step


class _Programs:
  """The jitted step for each set of healthy slices (a new mesh and batch size per set).

  With an `injector` (the real clock) each step checks it first, so an armed crash fails the step's program with a
  device error, and the step keeps its input state (no donation): the slices that survive hold it.
  """

  def __init__(self, run: RunConfig, slices: list[list[jax.Device]], injector: injection.Injector | None):
    self.run, self.slices, self._cache, self._injector = run, slices, {}, injector
    if injector is not None:
      multislice.installed()  # (imported now, in about a second, not when the first device error is classified)
    self.tx = inner_optimizer(run.inner, run.total_steps)

  def get(self, alive: tuple[int, ...]):
    """(mesh, state shardings, jitted step) over the devices of the `alive` slices."""
    if alive not in self._cache:
      mesh = devices_lib.slice_mesh([d for s in alive for d in self.slices[s]], self.run.mesh.tensor)
      params_sh = lm.param_shardings(self.run.model, mesh, self.run.fsdp)
      abstract = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                              lm.abstract_params(self.run.model), params_sh)
      state_sh = jax.jit(lambda p: init_state(p, self.tx)).lower(abstract).compile().output_shardings
      hook = injection.device_check(self._injector, 0, mesh) if self._injector else None
      step = jax.jit(make_train_step(self.run.model, self.tx, hook, mesh),
                     in_shardings=(state_sh, NamedSharding(mesh, P("data"))), out_shardings=(state_sh, None),
                     donate_argnums=() if self._injector else 0)
      self._cache[alive] = (mesh, state_sh, step)
    return self._cache[alive]

  def warm(self, alive: tuple[int, ...], state, batch_rows: int) -> None:
    """Under the real clock: compiles (and runs once, on a batch of zeros, its results dropped) the step over
    `alive`, so the compile is not taken for a step's time."""
    if self._injector is not None:
      mesh, state_sh, step = self.get(alive)
      zeros = np.zeros((batch_rows, self.run.data.seq_len + 1), np.int32)  # (inputs and targets)
      batch = jax.device_put(zeros, NamedSharding(mesh, P("data")))
      jax.block_until_ready(step(jax.device_put(state, state_sh), batch))


def train_dp_under_faults(run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str) -> RunResult:
  """Trains `dp_elastic` or `dp_restart` to the token budget against the seeded crash trace, on either clock."""
  elastic = run.mode == "dp_elastic"
  f = run.faults
  slices = devices_lib.make_slices(devices_lib.controller_devices(run.num_devices), run.num_slices)
  active = run.learners  # slices the job trains on; the rest are hot spares
  injector = injection.Injector(1) if run.clock.kind == "real" else None
  programs = _Programs(run, slices, injector)
  per_slice = run.data.batch_size // run.learners
  streams = [exp.shard(s, active, per_slice) for s in range(active)]
  tokens_per_slice_step = per_slice * run.data.seq_len

  full = tuple(range(active))
  mesh, state_sh, step_fn = programs.get(full)
  params = jax.jit(lm.init_params, static_argnums=0, out_shardings=state_sh.params)(run.model, jax.random.key(run.seed))
  num_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  _, step_s, comm = allreduce.dp_step(run, num_bytes, full)  # the link model's all-reduce among the slices at work
  clock = job_time.WallTime(run.total_steps) if injector else job_time.ModeledTime(step_s, run.total_steps)
  link_bytes = cross_bytes = 0.0
  state = jax.jit(lambda p: init_state(p, programs.tx), out_shardings=state_sh)(params)
  programs.warm(full, state, per_slice * active)
  tokens, steps, alive = 0, 0, full
  useful = lost = 0.0  # slice-seconds of steps taken / of steps rolled back
  advanced = 0.0  # seconds of steps that stand
  since_ckpt: list[tuple[float, float]] = []  # (slice-seconds, seconds) of steps a restart would roll back
  wall, restores = Stopwatch(), []

  eval_marks = Marks(run.eval_every * run.tokens_per_step)
  eval_loss = float("nan")
  lr = inner_lr(run.inner, run.total_steps)
  with (make_logger(run, workdir, name, time_kind="wall" if clock.real else "modeled") as logger,
        _restart_checkpoints(workdir, name) if not elastic else contextlib.nullcontext() as ckpts):
    failures = job_failures.JobFailures(
        f, len(slices), active, run.seed, elastic,
        lambda s, at, detail: logger.log("fault", dict(fault="crash", slice=s, time=at, **detail)))

    def save():  # copied to the host now (the next step may donate the state), written on the saver thread
      host, meta = jax.device_get(state), dict(data=[s.state() for s in streams], tokens=tokens)
      ckpts.save_async(steps, lambda: (host, meta))
    if not elastic:
      save()

    def evaluate():
      nonlocal eval_loss
      with clock.aside():
        eval_loss = exp.evaluate(state.params, mesh)
      logger.log("eval", dict(step=steps, tokens=tokens, time=clock.now(), **exp.eval_fields(eval_loss)))

    clock.start()
    while tokens < run.token_budget and not clock.gave_up():
      t = clock.now()
      if not elastic and t < failures.resume_at:  # down: failures meanwhile are handled by the same restart
        while failures.next_time() < failures.resume_at:
          clock.wait_until(failures.next_time())
          failures.fail(failures.next_slice())
        clock.wait_until(failures.resume_at)
        continue
      healthy = failures.healthy(t)
      if elastic and healthy != alive:
        if healthy:
          programs.warm(healthy, state, per_slice * len(healthy))
          clock.wait_until(t + f.reconfig_seconds)  # (under the real clock: no sooner than its compile)
          failures.fail_before(clock.now())  # slices failing during the reconfiguration are dropped by it too
          healthy = tuple(s for s in healthy if s in failures.healthy(clock.now()))  # (one back waits its turn)
        if not healthy:
          clock.wait_until(failures.first_repair())  # every slice down: wait for the first repair
          continue
        alive = healthy
        mesh, state_sh, step_fn = programs.get(alive)
        _, step_s, comm = allreduce.dp_step(run, num_bytes, alive)
        clock.step_s = step_s
        state = jax.device_put(state, state_sh)
      crash_s = failures.next_slice()
      in_use = crash_s in alive  # (the slices at work: all of them without elasticity)
      if clock.fails_in_step(failures.next_time()):
        detail = {}
        if clock.real and in_use:  # the job's next step fails with a device error
          error = _failing_step(step_fn, state, streams, alive, mesh, injector, [d for s in alive for d in slices[s]])
          detail = dict(surfaced=clock.now(), error=error)
        clock.wait_until(failures.next_time())
        failures.fail(crash_s, detail)
        if elastic or not in_use:
          continue  # the in-flight step is lost (not applied); elastic DP reconfigures next iteration
        lost += sum(x for x, _ in since_ckpt)
        advanced -= sum(y for _, y in since_ckpt)
        since_ckpt = []
        ckpts.flush()  # the job restarts from its newest written checkpoint
        start = time.perf_counter()
        restored = ckpts.restore_latest(state)
        if restored is None:
          raise RuntimeError(f"{name}: no restart checkpoint under {ckpts.directory} could be restored (see warnings)")
        steps, state, meta = restored
        restores.append(time.perf_counter() - start)
        tokens = meta["tokens"]
        for stream, pos in zip(streams, meta["data"]):
          stream.restore(pos)
        continue
      started = clock.now()
      batch = np.concatenate([next(streams[s]) for s in alive])
      state, metrics = step_fn(state, jax.device_put(batch, NamedSharding(mesh, P("data"))))
      seconds = clock.stepped(started, (state, metrics))
      n = len(alive)
      steps += 1
      tokens += n * tokens_per_slice_step
      useful += n * seconds
      advanced += seconds
      link_bytes, cross_bytes = link_bytes + comm.link_bytes, cross_bytes + comm.cross_region_bytes
      since_ckpt.append((n * seconds, seconds))
      if not elastic and due(steps, f.restart_checkpoint_every):
        save()
        since_ckpt = []
      if due(steps, run.log_every):
        logger.log("train", dict(step=steps, tokens=tokens, time=clock.now(), loss=float(metrics["loss"]), slices=n,
                                 lr=lr(steps - 1)))
      if eval_marks.reached(tokens) or tokens >= run.token_budget or clock.gave_up():
        eval_marks.advance()
        evaluate()
    if tokens < run.token_budget:  # gave up: report where the model got to
      evaluate()
    records = logger.records
    saves = ckpts.blocking_seconds if ckpts else []
  t = clock.now()
  allocated = len(slices) * t
  return RunResult(
      run=name, mode=run.mode, tokens=tokens, final_eval_loss=eval_loss, wall_seconds=wall(),
      virtual_seconds=float("nan") if clock.real else t, tokens_per_second=tokens / wall(), records=records,
      params=jax.device_get(state.params), time_kind="wall" if clock.real else "modeled",
      extras=dict(goodput=(useful - lost) / allocated if allocated else 0.0,
                  uptime=advanced / t if t else 0.0, faults=failures.count, bytes_per_token=link_bytes / max(tokens, 1),
                  cross_bytes_per_token=cross_bytes / max(tokens, 1), **clock.extras(),
                  **(dict(checkpoint_saves=len(saves), save_block_ms=1e3 * float(np.mean(saves)),
                          restores=len(restores), restore_wall_s=float(np.mean(restores)) if restores else 0.0)
                     if saves else {})))


def _failing_step(step_fn, state, streams, used: tuple[int, ...], mesh, injector: injection.Injector,
                  devices: list[jax.Device]) -> str:
  """Under the real clock, a failure of a slice at work: the job's next step, armed, fails with a device error
  (its data is served again after the restart or reconfiguration). The error's description."""
  positions = [stream.state() for stream in streams]
  batch = np.concatenate([next(streams[s]) for s in used])
  injector.arm(0, 0)
  try:
    jax.block_until_ready(step_fn(state, jax.device_put(batch, NamedSharding(mesh, P("data")))))
  except jax.errors.JaxRuntimeError as error:
    if not injection.slice_lost(error):
      raise
    return injection.describe(error)
  finally:
    injector.settle([devices])  # (disarms it, and clears the failed program's error)
    for stream, position in zip(streams, positions):
      stream.restore(position)
  raise RuntimeError("a step armed to fail ran to its end")


@contextlib.contextmanager
def _restart_checkpoints(workdir: str | os.PathLike | None, name: str):
  """`Checkpoints` in a directory of their own (inside the run's directory when it has one), removed at the end.

  They exist for the job's restarts within this run; the run itself is not resumable from them.
  """
  parent = pathlib.Path(workdir) / name if workdir is not None else None
  with tempfile.TemporaryDirectory(prefix="restart-checkpoints-", dir=parent) as directory:
    checkpoints = Checkpoints(directory, keep=2, resumable=False)
    try:
      yield checkpoints
    except BaseException:
      checkpoints.close(quiet=True)  # its errors never hide the run's
      raise
    checkpoints.close()
