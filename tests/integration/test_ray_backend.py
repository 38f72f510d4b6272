"""Learners in Ray actors (backend "ray", runtime/diloco/learner/ray_learner.py): under the virtual clock a run is the
in-process run, record for record and Θ bit for bit, faults included, and a killed driver's rerun resumes to the same
bits; what is not built yet is refused by name."""

import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import jax
import numpy as np
import pytest

from configs import smoke
from runtime.diloco.controller import Controller
from runtime.errors import ConfigError
from runtime.experiments import modes
from runtime.train.harness import Experiment
from runtime.trained.saved import load_model
from test_resume import assert_resumes_bit_identical
from test_trace_replay import _trace

ray = pytest.importorskip("ray")
MTBI = 256 * 60.0  # per chip: a crash of each 256-chip slice every minute of modeled time, on average


def _smoke(backend: str, schedule: str = "", mtbi_chip_seconds: float = 0.0, processes: int = 1):
  config = smoke.get_config()
  config.learners, config.num_devices, config.backend = 2, 4, backend  # 2 learners x 2 simulated devices
  config.ray.processes_per_learner = processes  # (2: each learner a gang of 2 processes of one device each)
  config.checkpoint_wall_seconds = 0.0
  config.faults.schedule = schedule
  if mtbi_chip_seconds:  # random crashes of every slice, each repaired in 10 s
    config.faults.mtbi_chip_seconds, config.faults.repair_seconds = mtbi_chip_seconds, 10.0
  return config


def _records(run_dir) -> list[dict]:
  """The run's records without wall time (which no two runs share)."""
  return [{k: v for k, v in json.loads(line).items() if k != "wall_time" and not k.startswith("host_")}
          for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def cluster():
  """One local cluster for the module's runs (the runs would start it themselves; started here, it is shared)."""
  from runtime.diloco.learner import ray_learner  # pylint: disable=g-import-not-at-top
  ray_learner.ensure_cluster()
  yield
  ray.shutdown()


@pytest.mark.parametrize("schedule", ["", "crash:learner=1,time=25,repair=10;corrupt:learner=0,time=12,how=nan"],
                         ids=["fault_free", "crash_and_corrupt_report"])
def test_learners_in_actors_train_the_in_process_run_bit_for_bit(cluster, tmp_path, schedule, monkeypatch):
  del cluster
  put, puts = ray.put, []
  monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(value) or put(value, **kw))
  results = {b: modes.train(_smoke(b, schedule), tmp_path / b)[0] for b in ("ray", "local")}
  remote, local = _records(tmp_path / "ray" / "decoupled"), _records(tmp_path / "local" / "decoupled")
  assert len(remote) >= 9 and remote == local
  merges = sum(r["kind"] == "merge" for r in remote)
  assert merges >= 6
  if not schedule:  # Θ put once for both learners: at the start, and after each merge
    assert len(puts) == merges + 1, (len(puts), merges)
  faults = [r["fault"] for r in remote if r["kind"] == "fault"]
  assert faults == ([] if not schedule else ["corrupt", "quarantine", "crash", "rejoin"])
  if schedule:  # the crash was raised inside the actor's program and surfaced as the device error it is
    crash = next(r for r in remote if r.get("fault") == "crash")
    assert "SliceCrash: injected crash of learner 1's slice" in crash["detail"]
  assert results["ray"].final_eval_loss == results["local"].final_eval_loss
  thetas = [load_model(tmp_path / b / "decoupled").params for b in ("ray", "local")]
  jax.tree.map(np.testing.assert_array_equal, *thetas)


@pytest.mark.parametrize("trace", ["random", "replayed"])
def test_slice_crash_traces_in_actors_train_the_in_process_run_bit_for_bit(cluster, tmp_path, trace):
  del cluster  # (each slice's seeded trace, or one recorded; the crashes armed in the actors' injectors)
  configs = {b: _smoke(b, mtbi_chip_seconds=MTBI if trace == "random" else 0.0) for b in ("ray", "local")}
  if trace == "replayed":  # slice 1 fails at t=20 and is back at t=30
    for config in configs.values():
      config.faults.trace = _trace(tmp_path, {1: [[20.0, 30.0]]}, slices=2, learners=2, kind="decoupled")
  results = {b: modes.train(config, tmp_path / b)[0] for b, config in configs.items()}
  remote, local = _records(tmp_path / "ray" / "decoupled"), _records(tmp_path / "local" / "decoupled")
  crashes = [r["detail"] for r in remote if r.get("fault") == "crash"]
  assert remote == local
  assert crashes and all("slice interrupted" in c for c in crashes), crashes
  assert results["ray"].final_eval_loss == results["local"].final_eval_loss


def test_compressed_reports_and_theta_cross_to_actors_bit_for_bit(cluster, tmp_path):
  # int8 both ways: a report leaves its actor as its payload's bytes, Θ's update reaches it as bytes decoded onto the
  # Θ its downlink holds there; through a crash and a payload flipped on the wire (quarantined), the in-process run
  del cluster
  schedule = "crash:learner=1,time=25,repair=10;corrupt:learner=0,time=12,how=flip"
  results = {}
  for backend in ("ray", "local"):
    config = _smoke(backend, schedule)
    config.compression.up, config.compression.down = "int8", "int8"
    results[backend] = modes.train(config, tmp_path / backend)[0]
  remote = _records(tmp_path / "ray" / "decoupled")
  assert remote == _records(tmp_path / "local" / "decoupled")
  assert [r["fault"] for r in remote if r["kind"] == "fault"] == ["corrupt", "quarantine", "crash", "rejoin"]
  merge = next(r for r in remote if r["kind"] == "merge")  # (its reports' bytes: int8 and scales, not fp32's 4 a value)
  fp32 = 4 * sum(x.size for x in jax.tree.leaves(results["ray"].params))
  assert 0 < merge["bytes_up"] < 0.3 * fp32 * merge["num_merged"], merge
  jax.tree.map(np.testing.assert_array_equal, results["ray"].params, results["local"].params)


@pytest.mark.slow  # ~30 s (the same machinery as the whole-Θ test above; its kill under the real clock is in the suite)
def test_streaming_fragments_cross_to_actors_bit_for_bit(cluster, tmp_path):
  # fragments=5 with one overlap step: each report a fragment's tensors, each delivery one fragment's Θ
  del cluster
  schedule = "crash:learner=1,time=25,repair=10;corrupt:learner=0,time=12,how=nan"
  results = {}
  for backend in ("ray", "local"):
    config = _smoke(backend, schedule)
    config.fragments, config.overlap_steps = 5, 1
    results[backend] = modes.train(config, tmp_path / backend)[0]
  remote = _records(tmp_path / "ray" / "decoupled")
  assert len(remote) >= 40 and remote == _records(tmp_path / "local" / "decoupled")
  assert [r["fault"] for r in remote if r["kind"] == "fault"] == ["corrupt", "quarantine", "crash", "rejoin"]
  jax.tree.map(np.testing.assert_array_equal, results["ray"].params, results["local"].params)


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.slow)], ids=["actor", "gang"])
def test_the_driver_killed_and_rerun_resumes_with_new_actors_bit_identical(cluster, tmp_path, monkeypatch, processes):
  # Killed as it is about to save the checkpoints of merges 2 and 4, so it resumes from those of merges 1 (before the
  # crash at t=25) and 3 (learner 1 down, its state lost): each rerun restores every learner into new actors (a
  # gang's members each lay out their share of the arrays they are sent).
  del cluster
  config = _smoke("ray", "crash:learner=1,time=25,repair=10;corrupt:learner=0,time=12,how=nan", processes=processes)
  config.checkpoint_every = 1
  result = assert_resumes_bit_identical(config, tmp_path, monkeypatch, kills=(2, 4))
  assert result.extras["faults"] == 2  # (the crash and the corrupt report; their rejoin and quarantine follow)


def test_under_the_real_clock_learners_in_actors_train_to_the_budget_through_a_crash(cluster, tmp_path):
  # A part's future is the actor's part_done; the crash is armed at an inner step, raised in the actor's program.
  del cluster
  config = _smoke("ray", "crash:learner=1,step=24,repair=0.5")
  config.clock.kind = "real"
  result = modes.train(config, tmp_path)[0]
  records = _records(tmp_path / "decoupled")
  assert result.tokens == config.total_steps * config.data.batch_size * config.data.seq_len
  crashes = [r["detail"] for r in records if r.get("fault") == "crash"]
  assert len(crashes) == 1 and "SliceCrash: injected crash of learner 1's slice at inner step 24" in crashes[0]
  assert [r["learner"] for r in records if r.get("fault") == "rejoin"] == [1]  # after its 0.5 s (not the 60 s default)
  assert result.extras["merges"] >= 6 and result.final_eval_loss < 4.0  # (uniform over bytes: 5.5)


def _killed_run(tmp_path, schedule: str, kill_at_step: int | None = None, hang_seconds: float = 120.0,
                processes: int = 1, member: int = 0, how: signal.Signals = signal.SIGKILL, hang_factor: float = 10.0,
                fragments: int = 1):
  """A real-clock run whose learner 1 loses a process: by the injector (`schedule`), or its gang's `member` sent
  `how` (SIGKILL; SIGSTOP: it neither answers nor dies) from outside once it has trained `kill_at_step` inner steps.
  Its controller, result, records and learner 1's first process ids."""
  config = _smoke("ray", schedule, processes=processes)
  config.clock.kind, config.ray.hang_seconds, config.ray.hang_factor = "real", hang_seconds, hang_factor
  config.fragments = fragments
  if kill_at_step is not None:
    config.faults.repair_seconds = 0.5  # (the injector's crash gives its own)
  run = modes.prepare(config)
  controller = Controller(run, Experiment(run), tmp_path, "decoupled")
  learner = controller.learners[1]
  first = learner.pids
  if kill_at_step is not None:
    def kill():  # (the book this side keeps grows with each answer of the actor)
      while learner.total_steps < kill_at_step:
        time.sleep(0.005)
      os.kill(first[member], how)
    threading.Thread(target=kill, daemon=True).start()
  result = controller.train()
  return controller, result, _records(tmp_path / "decoupled"), first, run


def _assert_replaced(controller, result, records, first, run, why: str = "process ended", rejoins: bool = True):
  """Learner 1 crashed once with its process and has new actors (every process of its gang new), on which it rejoined
  and trained (if `rejoins`: a hang found late may leave it nothing to train); every token merged once."""
  crashes = [r for r in records if r.get("fault") == "crash"]
  assert [r["learner"] for r in crashes] == [1] and why in crashes[0]["detail"], crashes
  learner = controller.learners[1]
  assert len(learner.pids) == len(first) and not set(learner.pids) & set(first)  # new processes
  if rejoins:
    rejoin = next(r for r in records if r.get("fault") == "rejoin")
    assert rejoin["learner"] == 1 and rejoin["time"] > crashes[0]["time"]
    assert any(at > rejoin["time"] for at, _ in learner.completions)  # which trained
  assert result.tokens == run.token_budget  # the budget merged (tokens written off were trained again) ...
  for m in range(2):  # ... and no batch of a learner's data twice
    ranges = sorted((a, b) for who, a, b in controller.log.merged_ranges if who == m)
    assert all(b <= a for (_, b), (a, _) in zip(ranges, ranges[1:])), ranges
  assert result.final_eval_loss < 4.0


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.slow)], ids=["actor", "gang"])
def test_a_learner_whose_process_the_injector_kills_mid_round_rejoins_on_a_new_actor(cluster, tmp_path, processes):
  # ends=process: at inner step 24 the actor's own step check SIGKILLs its process (no error is raised anywhere; in
  # a gang, each member's check ends its own)
  del cluster
  _assert_replaced(*_killed_run(tmp_path, "crash:learner=1,step=24,ends=process,repair=0.5", processes=processes))


@pytest.mark.parametrize("fragments", [1, 2])
def test_a_learner_whose_process_is_killed_from_outside_rejoins_on_a_new_actor(cluster, tmp_path, fragments):
  # (with fragments its new actor compiles for Θ whole, not for the last fragment's tensors put for a delivery)
  del cluster
  _assert_replaced(*_killed_run(tmp_path, "", kill_at_step=20, fragments=fragments))


def test_a_learner_whose_process_is_killed_before_the_run_starts_rejoins_on_a_new_actor(cluster, tmp_path):
  del cluster  # (found by its warm-up or its first reset: it crashes as the run starts)
  controller, result, records, first, run = _killed_run(tmp_path, "", kill_at_step=0)
  _assert_replaced(controller, result, records, first, run)
  assert next(r for r in records if r.get("fault") == "crash")["time"] < 1.0


def test_a_hung_learner_is_killed_at_its_deadline_and_rejoins_on_a_new_actor(cluster, tmp_path):
  # ends=hang: at inner step 24 the actor's step check stops for good; nothing answers, nothing dies, until the
  # part's (or a call's) deadline of ~5 s kills the process
  del cluster
  killed = _killed_run(tmp_path, "crash:learner=1,step=24,ends=hang,repair=0.5", hang_seconds=5.0)
  _assert_replaced(*killed, why="learner 1's process ended: hung: ", rejoins=False)
  crash = next(r for r in killed[2] if r.get("fault") == "crash")
  last = max(at for at, _ in killed[0].learners[1].completions if at < crash["time"])  # (its hung part came after)
  assert 5.0 <= crash["time"] <= last + 5.0 + 2.0 + 5.0  # at its deadline (5 s + 10 x its parts' ~0.1 s), + slack


def test_a_learner_whose_process_stops_answering_is_killed_at_its_call_deadline(cluster, tmp_path):
  # SIGSTOPped from outside at step 20: a call to it (a merge's Θ, a read of its book) is not answered in 5 s and
  # its process is killed (a part's deadline, 5 s + 1000 x its steps' time, would come far later)
  del cluster
  killed = _killed_run(tmp_path, "", kill_at_step=20, hang_seconds=5.0, how=signal.SIGSTOP, hang_factor=1000.0)
  _assert_replaced(*killed, why="learner 1's process ended: hung: no answer to ", rejoins=False)
  crash = next(r for r in killed[2] if r.get("fault") == "crash")
  last = max(at for at, _ in killed[0].learners[1].completions if at < crash["time"])  # (the call came after)
  assert last + 5.0 - 0.5 <= crash["time"] <= last + 5.0 + 3.0 and "in 5 s" in crash["detail"], crash


def test_a_learner_of_two_processes_trains_the_in_process_run_bit_for_bit(cluster, tmp_path):
  # ray.processes_per_learner=2: each learner a gang of two processes joined by jax.distributed, one device each, its
  # programs run across both (the gradient's mean over the slice an all-reduce between them); through a crash and
  # a corrupt report, the run is the in-process one record for record and Θ bit for bit
  del cluster
  schedule = "crash:learner=1,time=25,repair=10;corrupt:learner=0,time=12,how=nan"
  run = modes.prepare(_smoke("ray", schedule, processes=2))
  controller = Controller(run, Experiment(run), tmp_path / "ray", "decoupled")
  result = controller.train()
  local = modes.train(_smoke("local", schedule), tmp_path / "local")[0]
  for learner in controller.learners:
    assert learner.processes == 2 and len(set(learner.pids)) == 2
  remote = _records(tmp_path / "ray" / "decoupled")
  assert remote == _records(tmp_path / "local" / "decoupled")
  assert [r["fault"] for r in remote if r["kind"] == "fault"] == ["corrupt", "quarantine", "crash", "rejoin"]
  assert result.final_eval_loss == local.final_eval_loss
  jax.tree.map(np.testing.assert_array_equal, result.params, local.params)


@pytest.mark.parametrize("member", [1, pytest.param(0, marks=pytest.mark.slow)], ids=["second", "coordinator"])
def test_a_learner_of_two_processes_is_replaced_as_a_unit_when_one_is_killed(cluster, tmp_path, member):
  # One process of learner 1's gang SIGKILLed from outside mid-round: the other cannot go on alone (its programs
  # need both); the learner crashes once, both are ended and a new gang of two takes its place, and it rejoins
  del cluster
  killed = _killed_run(tmp_path, "", kill_at_step=20, processes=2, member=member)
  _assert_replaced(*killed)
  assert killed[0].learners[1].processes == 2


@pytest.mark.slow  # a cluster of its own, started and stopped around one launch (~40 s)
def test_a_run_joins_a_running_cluster_at_its_address_and_leaves_it_running(tmp_path):
  import psutil  # pylint: disable=g-import-not-at-top  (Ray's own dependency)
  with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
  # Ray's own settings: the cluster and the driver share a token (a fresh one here)
  env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
  ray_cli = pathlib.Path(sys.executable).parent / "ray"
  log, files = tmp_path / "head.log", tempfile.mkdtemp(prefix="ray-")  # (its sockets' paths must be short)
  with log.open("w") as out:
    head = subprocess.Popen([str(ray_cli), "start", "--head", f"--port={port}", "--num-cpus=2", "--block",
                             "--include-dashboard=false", f"--temp-dir={files}"], stdout=out,
                            stderr=subprocess.STDOUT, env=env)
  members = []
  try:
    for _ in range(120):
      if "Ray runtime started" in log.read_text() or head.poll() is not None:
        break
      time.sleep(0.5)
    assert head.poll() is None, log.read_text()
    members = psutil.Process(head.pid).children(recursive=True)
    run = subprocess.run(
        [sys.executable, "-m", "launch.train", "--config=configs/smoke.py", f"--workdir={tmp_path / 'w'}",
         "--config.backend=ray", f"--config.ray.address=127.0.0.1:{port}", "--config.learners=2",
         "--config.num_devices=4", "--config.checkpoint_wall_seconds=0", "--config.progress=False"],
        env=env, capture_output=True, text=True, timeout=400, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    records = _records(tmp_path / "w" / "decoupled")
    assert sum(r["kind"] == "merge" for r in records) == 6 and records[-1]["eval_loss"] < 4.0
    assert head.poll() is None  # the cluster it joined is still running
  finally:
    if head.poll() is None:
      head.send_signal(signal.SIGTERM)  # (`ray start --block` stops the processes it started)
    _, alive = psutil.wait_procs(members, timeout=30)
    for process in alive:
      process.kill()
    head.wait(timeout=30)
    shutil.rmtree(files, ignore_errors=True)


@pytest.mark.parametrize("field, value, allowed", [
    ("slices_per_learner", 2, "1 with backend 'ray'"),
    ("data.assignment", "service", "'shards' with backend 'ray'"),
    ("ray.address", "auto", "'' unless backend is 'ray'"),
    ("slices", 3, "0 (no spare slices) with backend 'ray'"),
    ("ray.hang_seconds", 0.0, "a number of seconds > 0"),
    ("ray.processes_per_learner", 3, "an integer >= 1 that splits each learner's slice evenly"),
])
def test_what_the_ray_backend_has_not_built_is_refused_naming_the_field(field, value, allowed):
  config = _smoke("local" if field == "ray.address" else "ray")
  section, _, name = field.rpartition(".")
  setattr(config[section] if section else config, name, value)
  if field == "slices_per_learner":
    config.num_devices = 8
  with pytest.raises(ConfigError) as refused:
    modes.prepare(config)
  assert field in str(refused.value) and allowed in str(refused.value)


@pytest.mark.parametrize("backend, address, allowed", [
    ("local", "", "1 unless backend is 'ray'"),
    ("ray", "127.0.0.1:6379", "1 with ray.address '127.0.0.1:6379' (a gang's processes on several hosts are not built"),
])
def test_a_learner_of_several_processes_is_refused_where_it_is_not_built(backend, address, allowed):
  config = _smoke(backend, processes=2)
  config.ray.address = address
  with pytest.raises(ConfigError) as refused:
    modes.prepare(config)
  assert "ray.processes_per_learner" in str(refused.value) and allowed in str(refused.value)


@pytest.mark.parametrize("backend, clock", [("local", "real"), ("ray", "virtual")])
def test_a_crash_that_ends_a_process_is_refused_where_there_is_none_or_no_moment_for_it(backend, clock):
  config = _smoke(backend, "crash:learner=1,step=24,ends=process")
  config.clock.kind = clock
  with pytest.raises(ConfigError) as refused:
    modes.prepare(config)
  assert "faults.schedule" in str(refused.value) and "ends=program unless backend is 'ray'" in str(refused.value)
