"""Synchronous data-parallel baseline: one jitted train step over a mesh of all devices."""

import os
import pathlib
import time
from typing import Callable

import jax
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime.data import shards as data_lib
from runtime.cluster import devices as devices_lib
from runtime.checkpoint.store import Checkpoints
from runtime.config.run import RunConfig
from runtime.train.harness import Experiment, RunResult, Stopwatch, host, make_logger, run_time_kind
from runtime.network import allreduce
from runtime.periodic import SinceLast, due
from runtime.train import preemption
from runtime.train.optim import inner_lr, inner_optimizer
from runtime.train.programs import init_state, make_train_step


def train_dp(run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str = "dp") -> RunResult:
  """Trains for run.total_steps at the full global batch; metrics are pulled one step late."""
  mesh = devices_lib.slice_mesh(devices_lib.controller_devices(run.num_devices), run.mesh.tensor)
  tx = inner_optimizer(run.inner, run.total_steps)
  params = jax.jit(lm.init_params, static_argnums=0, out_shardings=lm.param_shardings(run.model, mesh, run.fsdp))(
      run.model, jax.random.key(run.seed))
  state = jax.jit(lambda p: init_state(p, tx))(params)
  state_sh = jax.tree.map(lambda x: x.sharding, state)
  batch_sh = NamedSharding(mesh, P("data"))
  step_fn = jax.jit(make_train_step(run.model, tx, mesh=mesh), in_shardings=(state_sh, batch_sh),
                    out_shardings=(state_sh, None), donate_argnums=0)
  stream = data_lib.Prefetcher(exp.shard(0, 1, run.data.batch_size), depth=run.data.prefetch,
                               transform=lambda b: jax.device_put(b, batch_sh))
  wall = Stopwatch()
  # Under the virtual clock a DP step takes the modeled step time of the slowest device group (plus, with the link
  # model active, its gradient all-reduce among run.learners learner-sized groups placed in regions).
  num_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  compute_s, step_s, comm = allreduce.dp_step(run, num_bytes, range(run.learners))
  clock = (lambda step: step * step_s) if run.clock.kind == "virtual" else (lambda step: wall())
  lr = inner_lr(run.inner, run.total_steps)
  eval_loss, start = float("nan"), 0
  checkpoints = None
  if workdir is not None and run.checkpoints:
    checkpoints = Checkpoints(pathlib.Path(workdir) / name / "checkpoints", run.checkpoint_keep)
    restored = checkpoints.restore_latest(state) if run.resume else None
    if restored is not None:  # the state, the data position and the last eval: everything that decides the rest
      start, state, meta = restored
      stream.restore(meta["data"])
      eval_loss = meta["eval_loss"]
      logging.info("dp: resumed from %s at step %d", checkpoints.directory / str(start), start)
  resume_after = start * run.tokens_per_step if checkpoints is not None and run.resume else None
  try:
    with make_logger(run, workdir, name, resume_after=resume_after) as logger, stream:
      # The host waits for step t-1 after dispatching step t: the device never idles, and at most two
      # steps are in flight (a deep queue of multi-device programs can stall XLA:CPU's rendezvous).
      pending, saved_at = None, start
      by_wall = SinceLast(seconds=run.checkpoint_wall_seconds, at=time.monotonic())  # the host's seconds since a save
      for step in range(start + 1, run.total_steps + 1):
        if preemption.requested():  # a signal asked the run to stop: step - 1 is the step in progress
          if pending is not None:
            _finish_step(logger, run, *pending, clock, wall, lr)
          _stop(run, checkpoints, step - 1, saved_at, lambda: (state, dict(data=stream.state(), eval_loss=eval_loss)))
        state, metrics = step_fn(state, next(stream))
        if pending is not None:
          _finish_step(logger, run, *pending, clock, wall, lr)
        pending = (step, metrics)
        if due(step, run.eval_every, run.total_steps):
          eval_loss = exp.evaluate(state.params, mesh)
          logger.log("eval", dict(step=step, tokens=step * run.tokens_per_step, time=clock(step),
                                  **exp.eval_fields(eval_loss)))
        if checkpoints is not None and (due(step, run.checkpoint_every or run.total_steps, run.total_steps)
                                        or by_wall.due(0, time.monotonic())):
          _finish_step(logger, run, *pending, clock, wall, lr)  # its record precedes the checkpoint
          pending = None
          checkpoints.save(step, state, dict(data=stream.state(), eval_loss=eval_loss))
          saved_at = step
          by_wall.done(0, time.monotonic())
      if pending is not None:
        _finish_step(logger, run, *pending, clock, wall, lr)
      if checkpoints is not None:
        checkpoints.close()
      wall_s = wall()
      records = logger.records
  except BaseException:
    if checkpoints is not None:
      checkpoints.close(quiet=True)  # the saves begun finish (an unfinished one is removed); the error stays
    raise
  tokens = run.total_steps * run.tokens_per_step
  virtual = clock(run.total_steps) if run.clock.kind == "virtual" else float("nan")
  return RunResult(run=name, mode="dp", tokens=tokens, final_eval_loss=eval_loss, wall_seconds=wall_s,
                   virtual_seconds=virtual, tokens_per_second=tokens / wall_s, records=records,
                   params=jax.device_get(state.params), time_kind=run_time_kind(run),
                   extras=dict(busy_mean=compute_s / step_s,
                               **allreduce.dp_traffic(comm, run.tokens_per_step, num_bytes, run.learners)))


def _stop(run: RunConfig, checkpoints: Checkpoints | None, step: int, saved_at: int,
          to_save: Callable[[], tuple]) -> None:
  """Saves `step` (unless its checkpoint exists), waits until it is committed, and raises Interrupted."""
  saved = None
  if checkpoints is not None:
    saved = f"checkpoint {step} kept" if step > 0 else "nothing was trained yet"
    if step > saved_at:
      checkpoints.save(step, *to_save())
      saved = f"checkpoint {step} saved"
    checkpoints.close()
  where = f"step {step} ({step * run.tokens_per_step:,} tokens)"
  raise preemption.Interrupted(preemption.stop_message(where, saved), preemption.requested())


def _finish_step(logger, run: RunConfig, step: int, metrics: dict, clock: Callable[[int], float],
                 wall: Callable[[], float], lr: Callable[[int], float]) -> None:
  """Waits for `step`; logs it when due, with times read after the wait (its completion) and its inner lr."""
  if not due(step, run.log_every, run.total_steps):
    jax.block_until_ready(metrics)
    return
  m = host(metrics)
  logger.log("train", dict(step=step, tokens=step * run.tokens_per_step, time=clock(step), wall=wall(),
                           loss=float(m["loss"]), grad_norm=float(m["grad_norm"]), lr=lr(step - 1)))
