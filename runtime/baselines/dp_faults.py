"""Data-parallel baselines under the same fault trace, in virtual time with real training steps.

Both run synchronous steps over every healthy slice. Without elasticity, any failure stops the
whole job: it loses the steps since its last checkpoint, waits for a hot spare (first come first served; a spare
is free again when the slice it stood in for is repaired) or the slice's repair, then pays a restart; failures
meanwhile are handled by the same restart (the goodput simulator's semantics, runtime/sim/model.py). Its
checkpoints are real: saved with `Checkpoints` (orbax, asynchronous) every `faults.restart_checkpoint_every` steps and
restored from disk at each restart, whose wall time is reported beside the modeled `faults.restart_seconds`.
Elastic DP pays a short reconfiguration, continues on the surviving slices with a smaller global batch, and pays
it again when the slice returns. Their records' `time` is modeled under either clock.
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
from runtime.checkpoint.store import Checkpoints
from runtime.config.run import RunConfig
from runtime.train.harness import Experiment, RunResult, Stopwatch, make_logger
from runtime.faults import replay
from runtime.network import allreduce
from runtime.periodic import Marks, due
from runtime.train.optim import inner_lr, inner_optimizer
from runtime.train.programs import init_state, make_train_step


class _Programs:
  """The jitted step for each set of healthy slices (a new mesh and batch size per set)."""

  def __init__(self, run: RunConfig, slices: list[list[jax.Device]]):
    self.run, self.slices, self._cache = run, slices, {}
    self.tx = inner_optimizer(run.inner, run.total_steps)

  def get(self, alive: tuple[int, ...]):
    """(mesh, state shardings, jitted step) over the devices of the `alive` slices."""
    if alive not in self._cache:
      mesh = devices_lib.slice_mesh([d for s in alive for d in self.slices[s]])
      params_sh = lm.param_shardings(self.run.model, mesh, self.run.fsdp)
      abstract = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                              lm.abstract_params(self.run.model), params_sh)
      state_sh = jax.jit(lambda p: init_state(p, self.tx)).lower(abstract).compile().output_shardings
      step = jax.jit(make_train_step(self.run.model, self.tx), in_shardings=(state_sh, NamedSharding(mesh, P("data"))),
                     out_shardings=(state_sh, None), donate_argnums=0)
      self._cache[alive] = (mesh, state_sh, step)
    return self._cache[alive]


def train_dp_under_faults(run: RunConfig, exp: Experiment, workdir: str | os.PathLike | None, name: str) -> RunResult:
  """Trains `dp_elastic` or `dp_restart` to the token budget against the seeded crash trace."""
  elastic = run.mode == "dp_elastic"
  f = run.faults
  slices = devices_lib.make_slices(devices_lib.controller_devices(run.num_devices), run.num_slices)
  active = run.learners  # slices the job trains on; the rest are hot spares
  programs = _Programs(run, slices)
  per_slice = run.data.batch_size // run.learners
  streams = [exp.shard(s, active, per_slice) for s in range(active)]
  tokens_per_slice_step = per_slice * run.data.seq_len
  traces = [replay.slice_failures(f, s, run.seed) for s in range(len(slices))]
  failures_ahead = [next(tr, (float("inf"), 0.0)) for tr in traces]  # each slice's next (time, repair seconds)
  down_until = [0.0] * len(slices)
  spares = len(slices) - active  # dp_restart: hot spares (they never fail while they stand in, as in the simulator)
  repairs: list[float] = []  # dp_restart: when each failed slice of the job is back, in failure order
  resume_at = last_ready = 0.0  # dp_restart: when the job is up again / when its latest failure had a spare

  full = tuple(range(active))
  mesh, state_sh, step_fn = programs.get(full)
  params = jax.jit(lm.init_params, static_argnums=0, out_shardings=state_sh.params)(run.model, jax.random.key(run.seed))
  num_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  _, step_s, comm = allreduce.dp_step(run, num_bytes, full)  # the link model's all-reduce among the slices at work
  link_bytes = cross_bytes = 0.0
  state = jax.jit(lambda p: init_state(p, programs.tx), out_shardings=state_sh)(params)
  t, tokens, steps, alive = 0.0, 0, 0, full
  useful = lost = 0.0  # slice-seconds of steps taken / of steps rolled back
  advanced = 0.0  # seconds of steps that stand
  since_ckpt: list[tuple[float, float]] = []  # (slice-seconds, seconds) of steps a restart would roll back
  clock, failures, restores = Stopwatch(), 0, []

  eval_marks = Marks(run.eval_every * run.tokens_per_step)
  eval_loss = float("nan")
  # A job that fails faster than it checkpoints never finishes; give up after this much modeled time.
  give_up_at = 50 * run.total_steps * step_s
  lr = inner_lr(run.inner, run.total_steps)
  with (make_logger(run, workdir, name, time_kind="modeled") as logger,
        _restart_checkpoints(workdir, name) if not elastic else contextlib.nullcontext() as ckpts):
    def save():
      ckpts.save(steps, state, dict(data=[s.state() for s in streams], tokens=tokens))
    if not elastic:
      save()

    def first_failure() -> int:
      return int(np.argmin([at for at, _ in failures_ahead]))

    def fail(s: int) -> None:
      """Slice s fails at its trace's time; its repair ends that long after (not after the failure is noticed)."""
      nonlocal failures, resume_at, last_ready
      at, repair = failures_ahead[s]
      failures += 1
      down_until[s] = at + repair
      if not elastic and s < active:  # the job is down until this slice has a spare (or is back), then restarts
        n = len(repairs)
        ready = at + repair if not spares else at if n < spares else min(max(at, repairs[n - spares]), at + repair)
        last_ready = max(last_ready, ready)  # spares first come first served, to the earlier failure first
        repairs.append(at + repair)
        if last_ready >= resume_at:  # a spare ready during a restart joins that restart
          resume_at = last_ready + f.restart_seconds
      failures_ahead[s] = next(traces[s], (float("inf"), 0.0))
      logger.log("fault", dict(fault="crash", slice=s, time=at))

    def absorb(until: float) -> None:
      """Failures before `until` fall inside elastic DP's reconfiguration that ends then, which drops their slices
      too (as the simulator does): no reconfiguration of their own."""
      while failures_ahead[first_failure()][0] < until:
        fail(first_failure())

    while tokens < run.token_budget and t < give_up_at:
      healthy = tuple(s for s in range(active) if down_until[s] <= t)
      if not elastic and t < resume_at:  # down: failures meanwhile are handled by the same restart
        while failures_ahead[first_failure()][0] < resume_at:
          fail(first_failure())
        t = resume_at
        continue
      if elastic and healthy != alive:
        if healthy:
          t += f.reconfig_seconds
          absorb(t)  # slices failing during the reconfiguration are dropped by it too
          healthy = tuple(s for s in healthy if down_until[s] <= t)
        if not healthy:
          t = min(down_until[:active])  # every slice down: wait for the first repair
          continue
        alive = healthy
        mesh, state_sh, step_fn = programs.get(alive)
        _, step_s, comm = allreduce.dp_step(run, num_bytes, alive)
        state = jax.device_put(state, state_sh)
      crash_s = first_failure()
      if failures_ahead[crash_s][0] < t + step_s:  # a slice fails before this step completes
        t = max(t, failures_ahead[crash_s][0])
        fail(crash_s)
        in_use = crash_s in (alive if elastic else full)
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
      batch = np.concatenate([next(streams[s]) for s in (alive if elastic else full)])
      state, metrics = step_fn(state, jax.device_put(batch, NamedSharding(mesh, P("data"))))
      n = len(alive if elastic else full)
      t += step_s
      steps += 1
      tokens += n * tokens_per_slice_step
      useful += n * step_s
      advanced += step_s
      link_bytes, cross_bytes = link_bytes + comm.link_bytes, cross_bytes + comm.cross_region_bytes
      since_ckpt.append((n * step_s, step_s))
      if not elastic and due(steps, f.restart_checkpoint_every):
        save()
        since_ckpt = []
      if due(steps, run.log_every):
        logger.log("train", dict(step=steps, tokens=tokens, time=t, loss=float(metrics["loss"]), slices=n,
                                 lr=lr(steps - 1)))
      if eval_marks.reached(tokens) or tokens >= run.token_budget or t >= give_up_at:
        eval_marks.advance()
        eval_loss = exp.evaluate(state.params, mesh)
        logger.log("eval", dict(step=steps, tokens=tokens, time=t, eval_loss=eval_loss))
    if tokens < run.token_budget:  # gave up: report where the model got to
      eval_loss = exp.evaluate(state.params, mesh)
      logger.log("eval", dict(step=steps, tokens=tokens, time=t, eval_loss=eval_loss))
    records = logger.records
    saves = ckpts.blocking_seconds if ckpts else []
  allocated = len(slices) * t
  return RunResult(
      run=name, mode=run.mode, tokens=tokens, final_eval_loss=eval_loss, wall_seconds=clock(), virtual_seconds=t,
      tokens_per_second=tokens / clock(), records=records, params=jax.device_get(state.params), time_kind="modeled",
      extras=dict(goodput=(useful - lost) / allocated if allocated else 0.0,
                  uptime=advanced / t if t else 0.0, faults=failures, bytes_per_token=link_bytes / max(tokens, 1),
                  cross_bytes_per_token=cross_bytes / max(tokens, 1),
                  **(dict(checkpoint_saves=len(saves), save_block_ms=1e3 * float(np.mean(saves)),
                          restores=len(restores), restore_wall_s=float(np.mean(restores)) if restores else 0.0)
                     if saves else {})))


@contextlib.contextmanager
def _restart_checkpoints(workdir: str | os.PathLike | None, name: str):
  """`Checkpoints` in a directory of their own (inside the run's directory when it has one), removed at the end.

  They exist for the job's restarts within this run; the run itself is not resumable from them.
  """
  parent = pathlib.Path(workdir) / name if workdir is not None else None
  with tempfile.TemporaryDirectory(prefix="restart-checkpoints-", dir=parent) as directory:
    checkpoints = Checkpoints(directory, keep=2)
    try:
      yield checkpoints
    except BaseException:
      checkpoints.close(quiet=True)  # its errors never hide the run's
      raise
    checkpoints.close()
