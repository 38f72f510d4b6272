"""Benchmark: start-up compile time and the controller's CPU time per learner round with many learners.

Every measurement runs in a fresh process (its own simulated device count and compilation cache): Decoupled
DiLoCo under the virtual clock with a tiny model, M learners on one slice each, a few rounds. Start-up is the wall
time from the controller's construction to the first round dispatched on every learner; compilations are counted
from JAX's monitoring events (persistent-cache hits apart). The controller's CPU per learner round is its thread's
CPU time over the event loop after every learner's first `warmup_rounds`, divided by the learner rounds completed
in that window; its JAX share is the part spent inside JAX calls (enqueuing programs, copies, fetches), and the
enqueue column the part of it spent enqueuing the round programs alone (XLA's own cost per dispatch).

Each M runs with the persistent cache cold (a fresh directory) and warm (the same directory, a second process),
and, as a route around one compile per slice, cold with a cache key that leaves out the device assignment (as JAX
does on GPU only): one slice compiles, the others load that executable for their own devices.
"""

import copy
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import pickle
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from runtime.train import tree_transfer
from runtime.errors import ConfigError
from runtime.reporting.summary import summary_table

CPU_TARGET_MS = 2.0  # the controller's CPU time per learner round ...
CPU_TARGET_LEARNERS = 32  # ... at this many learners
ROUTES = ("plain", "shared_key")
_RESULT = "STARTUP_RESULT "
_ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class StartupBenchConfig:
  """Which learner counts to start, how each is laid out, and how long each runs."""

  learners: tuple[int, ...] = (4, 16, 32)  # M per measurement, one slice each
  devices_per_slice: int = 1  # simulated CPU devices per slice (M x this devices in all)
  rounds: int = 6  # rounds per learner (inner_steps each)
  warmup_rounds: int = 2  # each learner's first rounds left out of the CPU timing (compiles, first merges)
  routes: bool = True  # also measure the shared cache key and whether a compiled program runs on another slice

  def __post_init__(self) -> None:
    if not self.learners or min(self.learners) < 1:
      raise ConfigError("learners", self.learners, "one or more integers >= 1")
    if self.devices_per_slice < 1:
      raise ConfigError("devices_per_slice", self.devices_per_slice, "an integer >= 1")
    if not 1 <= self.warmup_rounds < self.rounds:
      raise ConfigError("warmup_rounds", self.warmup_rounds, f"an integer in [1, rounds={self.rounds})")


@dataclasses.dataclass(frozen=True)
class Setting:
  """One measurement, in one process."""

  learners: int
  devices_per_slice: int
  cache: str  # "cold" | "warm": whether `cache_dir` holds this run's programs
  cache_dir: str
  route: str = "plain"  # one of ROUTES


def setting_config(config: ml_collections.ConfigDict, bench: StartupBenchConfig, setting: Setting
                   ) -> ml_collections.ConfigDict:
  """`config` sized for the setting: M learners on M x devices_per_slice devices, `rounds` rounds, no evals."""
  config = copy.deepcopy(config)
  config.learners = setting.learners
  config.num_devices = setting.learners * setting.devices_per_slice
  config.slices = 0
  config.data.batch_size = 2 * config.num_devices  # two sequences per device
  config.total_steps = bench.rounds * config.inner_steps
  config.eval_every = config.total_steps + 1  # only the final evaluation, after the loop
  config.compile_cache = setting.cache_dir
  config.progress = config.tensorboard = False
  return config


# In the measured process ----------------------------------------------------------------------------


class JaxMeter:
  """CPU time of one thread inside wrapped JAX calls (nested calls counted once), and the part of it spent
  enqueuing round programs."""

  def __init__(self, thread: int):
    self.thread, self.seconds, self.round_seconds, self._depth = thread, 0.0, 0.0, 0

  def wrap(self, fn: Callable, round_program: bool = False) -> Callable:
    def metered(*args, **kwargs):
      if threading.get_ident() != self.thread or self._depth:
        return fn(*args, **kwargs)
      self._depth, start = 1, time.thread_time()
      try:
        return fn(*args, **kwargs)
      finally:
        seconds = time.thread_time() - start
        self._depth, self.seconds = 0, self.seconds + seconds
        self.round_seconds += seconds if round_program else 0.0
    return metered


def _meter_jax_calls(meter: JaxMeter, learners: list, log: Any) -> None:
  """Routes the controller's JAX entry points through `meter`: programs, copies, fetches."""
  from runtime.diloco.learner import receive  # pylint: disable=g-import-not-at-top
  for module, name in ((tree_transfer, "copy_to"), (tree_transfer, "fresh_copy"), (receive, "carry"),
                       (receive, "mix")):
    setattr(module, name, meter.wrap(getattr(module, name)))
  for name in ("device_get", "device_put", "block_until_ready"):
    setattr(jax, name, meter.wrap(getattr(jax, name)))
  del log  # (merge records' learning rates are evaluated in the merge worker)
  for learner in learners:
    learner._init = meter.wrap(learner._init)
    learner._round_program = meter.wrap(learner._round_program, round_program=True)
    learner._report_program = meter.wrap(learner._report_program, round_program=True)


def _cache_key_without_devices() -> None:
  """The persistent cache's key leaves out the device assignment on every platform, as on GPU (jax 0.10.2)."""
  from jax._src import cache_key  # pylint: disable=g-import-not-at-top
  hash_options = cache_key._hash_serialized_compile_options
  cache_key._hash_serialized_compile_options = lambda h, options, strip_device_assignment=False: hash_options(
      h, options, strip_device_assignment=True)


def _digest(tree: Any) -> str:
  return hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(tree))).hexdigest()[:12]


def measure(config: ml_collections.ConfigDict, warmup_rounds: int, route: str) -> dict[str, Any]:
  """Runs the config once in this process (JAX not started yet) and returns what the benchmark reports."""
  from runtime.bench.compile_counter import CompileCounter  # pylint: disable=g-import-not-at-top
  from runtime.diloco.controller import Controller  # pylint: disable=g-import-not-at-top
  from runtime.train.harness import Experiment  # pylint: disable=g-import-not-at-top
  from runtime.experiments.modes import prepare  # pylint: disable=g-import-not-at-top

  run = prepare(config)
  counter = CompileCounter()
  if route == "shared_key":
    _cache_key_without_devices()
  exp = Experiment(run)
  meter = JaxMeter(threading.get_ident())
  marks: dict[str, Any] = {}

  class TimedController(Controller):
    """The controller, marking when every learner has dispatched and when the CPU timing window opens."""

    def __init__(self, *args):
      super().__init__(*args)
      for learner in self.learners:
        learner.dispatch = self._marked(learner.dispatch, learner.index)

    def _marked(self, dispatch, index):
      def marked(*args, **kwargs):
        part = dispatch(*args, **kwargs)
        marks.setdefault("dispatched", set()).add(index)
        if "started" not in marks and len(marks["dispatched"]) == len(self.learners):
          marks["started"] = time.perf_counter()
        return part
      return marked

    def _on_part_done(self, event):
      super()._on_part_done(event)
      marks["parts"] = marks.get("parts", 0) + 1
      if marks["parts"] == warmup_rounds * len(self.learners):
        _meter_jax_calls(meter, self.learners, self.log)
        marks["warm"] = (time.perf_counter(), time.thread_time(), marks["parts"])

    def _loop(self, start):
      super()._loop(start)
      marks["end"] = (time.perf_counter(), time.thread_time(), marks["parts"], meter.seconds, meter.round_seconds)

  begin = time.perf_counter()
  result = TimedController(run, exp, None, "decoupled").train()
  started, (warm_at, warm_cpu, warm_parts) = marks["started"], marks["warm"]
  end_at, end_cpu, end_parts, jax_cpu, round_cpu = marks["end"]
  cpu = end_cpu - warm_cpu
  return dict(
      startup_s=started - begin, compiles=counter.compiled(started), cache_hits=counter.loaded(started),
      round_compiles=counter.compiled(started, name="jit(run_round)"), compiles_total=counter.compiled(),
      compile_s=counter.total_seconds("backend", started),
      trace_lower_s=counter.total_seconds("trace", started) + counter.total_seconds("lower", started),
      cpu_ms_per_round=1e3 * cpu / (end_parts - warm_parts), jax_share=jax_cpu / cpu if cpu else math.nan,
      enqueue_ms_per_round=1e3 * round_cpu / (end_parts - warm_parts),
      timed_rounds=end_parts - warm_parts, window_compiles=counter.compiled(end_at, since=warm_at),
      theta=_digest(result.params), devices=run.num_devices, load=os.getloadavg()[0])


def probe_aot_reuse() -> str:
  """Whether a round program compiled ahead of time for one slice runs on another slice's inputs (2 devices)."""
  from runtime.config.run import from_config_dict  # pylint: disable=g-import-not-at-top
  from runtime.cluster import devices as devices_lib  # pylint: disable=g-import-not-at-top
  from runtime.train.optim import inner_optimizer  # pylint: disable=g-import-not-at-top
  from runtime.train.programs import init_state, make_round  # pylint: disable=g-import-not-at-top
  from models import lm  # pylint: disable=g-import-not-at-top
  from configs import startup  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  run = from_config_dict(startup.get_config())
  devices_lib.configure_simulated_devices(2)
  tx = inner_optimizer(run.inner, run.total_steps)
  program = jax.jit(make_round(run.model, tx), donate_argnums=0)
  args = []
  for device in jax.devices()[:2]:
    mesh = devices_lib.slice_mesh([device])
    params = jax.jit(lm.init_params, static_argnums=0, out_shardings=lm.param_shardings(run.model, mesh))(
        run.model, jax.random.key(0))
    batches = np.zeros((run.inner_steps, 2, run.data.seq_len), np.int32)
    args.append((jax.jit(lambda p: init_state(p, tx))(params), jax.device_put(batches, NamedSharding(mesh, P()))))
  compiled = program.lower(*args[0]).compile()
  try:
    jax.block_until_ready(compiled(*args[1]))
  except Exception as error:  # pylint: disable=broad-except
    return f"refused: {type(error).__name__}: {str(error).splitlines()[0]}"
  return "accepted"


def child_main() -> None:
  """Entry point of a measurement process: a pickled job on stdin, one result line on stdout."""
  job = pickle.load(sys.stdin.buffer)
  result = probe_aot_reuse() if job is None else measure(*job)
  print(_RESULT + json.dumps(result), flush=True)


# In the benchmark's process ------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
  """This environment on simulated CPU devices, with the device count left to the child's config."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
  return env


def in_fresh_process(job: Any) -> Any:
  """Runs `measure(*job)` (or the AOT probe, job None) in a new Python process; returns its result."""
  code = "from runtime.bench import startup; startup.child_main()"
  done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(job), capture_output=True, cwd=_ROOT,
                        env=_child_env(), check=False)
  lines = [l for l in done.stdout.decode().splitlines() if l.startswith(_RESULT)]
  if done.returncode or not lines:
    raise RuntimeError(f"measurement process failed (exit {done.returncode}):\n{done.stderr.decode()[-3000:]}")
  return json.loads(lines[-1][len(_RESULT):])


def settings(bench: StartupBenchConfig, scratch: str) -> list[Setting]:
  """Per M: cold then warm in one cache directory, then (with routes) the shared key in a fresh one."""
  out = []
  for m in bench.learners:
    plain = os.path.join(scratch, f"m{m}")
    out += [Setting(m, bench.devices_per_slice, "cold", plain), Setting(m, bench.devices_per_slice, "warm", plain)]
    if bench.routes:
      out.append(Setting(m, bench.devices_per_slice, "cold", os.path.join(scratch, f"m{m}-shared"), "shared_key"))
  return out


COLUMNS = ["M", "devices", "route", "cache", "start-up s", "XLA compiles", "cache loads", "round compiles",
           "compile+load s", "trace+lower s", "ctrl CPU ms/round", "JAX share", "enqueue ms/round", "timed rounds",
           "window compiles",
           "Θ digest"]


def row(setting: Setting, result: dict[str, Any]) -> dict[str, Any]:
  """One table row of a measurement."""
  return {"M": setting.learners, "devices": result["devices"], "route": setting.route, "cache": setting.cache,
          "start-up s": result["startup_s"], "XLA compiles": result["compiles"], "cache loads": result["cache_hits"],
          "round compiles": result["round_compiles"], "compile+load s": result["compile_s"],
          "trace+lower s": result["trace_lower_s"], "ctrl CPU ms/round": result["cpu_ms_per_round"],
          "JAX share": result["jax_share"], "enqueue ms/round": result["enqueue_ms_per_round"],
          "timed rounds": result["timed_rounds"],
          "window compiles": result["window_compiles"], "Θ digest": result["theta"],
          "host load": result["load"]}


def verdict(rows: list[dict[str, Any]]) -> str:
  """MET / MISSED for the CPU target, from the plain runs at CPU_TARGET_LEARNERS learners."""
  at = [r["ctrl CPU ms/round"] for r in rows if r["M"] == CPU_TARGET_LEARNERS and r["route"] == "plain"]
  if not at:
    return f"controller CPU per learner round at M={CPU_TARGET_LEARNERS}: not measured"
  worst = max(at)
  status = "MET" if worst <= CPU_TARGET_MS else "MISSED"
  return (f"controller CPU per learner round at M={CPU_TARGET_LEARNERS}: {worst:.2f} ms (worst of "
          f"{len(at)} runs), target <= {CPU_TARGET_MS} ms: {status}")


def run(config: ml_collections.ConfigDict, bench: StartupBenchConfig) -> list[dict[str, Any]]:
  """Measures every setting in its own process; prints the table, the CPU verdict and the routes; returns rows."""
  rows = []
  with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
    for setting in settings(bench, scratch):
      job = (setting_config(config, bench, setting), bench.warmup_rounds, setting.route)
      rows.append(row(setting, in_fresh_process(job)))
      print(summary_table(rows[-1:], COLUMNS), flush=True)
  lines = [summary_table(rows, COLUMNS, title=(
      f"start-up and controller CPU: Decoupled DiLoCo, virtual clock, model {config.model.size}, H="
      f"{config.inner_steps}, {bench.rounds} rounds per learner (first {bench.warmup_rounds} untimed), "
      f"{bench.devices_per_slice} simulated CPU device(s) per slice, one fresh process per row")), verdict(rows)]
  shared = {r["M"]: r for r in rows if r["route"] == "shared_key"}
  for r in rows:
    if r["route"] == "plain" and r["cache"] == "cold" and r["M"] in shared:
      s = shared[r["M"]]
      lines.append(f"M={r['M']}: shared cache key: {s['round compiles']} round-program compile(s) instead of "
                   f"{r['round compiles']}, start-up {s['start-up s']:.1f} s instead of {r['start-up s']:.1f} s, "
                   f"final Θ {'identical' if s['Θ digest'] == r['Θ digest'] else 'DIFFERENT'}")
  if bench.routes:
    lines.append(f"a round program compiled ahead of time for slice 0, called on slice 1's inputs: "
                 f"{in_fresh_process(None)}")
  print("\n".join(lines), flush=True)
  return rows
