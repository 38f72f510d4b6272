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
import time

import jax
import numpy as np
import pytest

from configs import smoke
from invariants import assert_data_accounted
from runtime.diloco.controller import Controller
from runtime.diloco.membership import Membership
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


def _same_as_in_process(tmp_path, schedule: str, **fields) -> tuple[list[dict], object]:
  """The smoke run with `schedule` and `fields` (dotted names: "faults.learner_recovery") in actors and in process:
  asserts equal records and Θ; the records and the Ray run's result."""
  results = {}
  for backend in ("ray", "local"):
    config = _smoke(backend, schedule)
    for field, value in fields.items():
      section, _, name = field.rpartition(".")
      setattr(config[section] if section else config, name, value)
    results[backend] = modes.train(config, tmp_path / backend)[0]
  remote = _records(tmp_path / "ray" / "decoupled")
  assert remote == _records(tmp_path / "local" / "decoupled")
  jax.tree.map(np.testing.assert_array_equal, results["ray"].params, results["local"].params)
  return remote, results["ray"]


@pytest.fixture(scope="module")
def cluster():
  """One local cluster for the module's runs (the runs would start it themselves; started here, it is shared)."""
  from runtime.diloco.learner import ray_learner  # pylint: disable=g-import-not-at-top
  ray_learner.ensure_cluster()
  yield
  ray.shutdown()


@pytest.mark.parametrize("schedule, assignment", [
    ("", "shards"), ("crash:learner=1,time=25,repair=10;corrupt:learner=0,time=12,how=nan", "service")],
                         ids=["fault_free", "crash_and_corrupt_report_data_service"])
def test_learners_in_actors_train_the_in_process_run_bit_for_bit(cluster, tmp_path, schedule, assignment,
                                                                 monkeypatch):
  # With a crash and a corrupt report, the data comes from the service (data.assignment="service"): the controller
  # leases each part's serials and sends them with its dispatch; the actor's stream takes exactly those
  # (runtime/data/service.py: Grants). The crashed learner rewinds onto its own leases; every window is accounted for.
  del cluster
  put, puts = ray.put, []
  monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(value) or put(value, **kw))
  from runtime.diloco.learner import ray_learner  # pylint: disable=g-import-not-at-top
  events, made, join = [], ray_learner._Gang.__init__, ray_learner.RayLearner.join  # pylint: disable=protected-access
  monkeypatch.setattr(ray_learner._Gang, "__init__",  # pylint: disable=protected-access
                      lambda self, *args, **kw: events.append("made") or made(self, *args, **kw))
  monkeypatch.setattr(ray_learner.RayLearner, "join", lambda self: events.append("joined") or join(self))
  calls, call = [], ray_learner._Gang.call  # pylint: disable=protected-access
  monkeypatch.setattr(ray_learner._Gang, "call",  # pylint: disable=protected-access
                      lambda self, name, *a, **kw: calls.append(a[0] if name == "call" else name) or call(
                          self, name, *a, **kw))
  results = {}
  for backend in ("ray", "local"):
    config = _smoke(backend, schedule)
    config.data.assignment = assignment
    results[backend] = modes.train(config, tmp_path / backend)[0]
  remote, local = _records(tmp_path / "ray" / "decoupled"), _records(tmp_path / "local" / "decoupled")
  assert len(remote) >= 9 and remote == local
  assert events[:4] == ["made", "made", "joined", "joined"]  # both actors' processes start before either is awaited
  # the moves of a learner's book alone (a report sent or settled, waiting, done) ride with its next call, and when
  # its parts end is read off its last answer
  assert not {"report_sent", "report_settled", "wait", "finish", "needs_theta_at", "parts_end_at"} & set(calls), (
      sorted(set(calls)))
  merges = sum(r["kind"] == "merge" for r in remote)
  assert merges >= 6
  if not schedule:  # Θ put once for both learners: at the start, and after each merge
    assert len(puts) == merges + 1, (len(puts), merges)
  faults = [r["fault"] for r in remote if r["kind"] == "fault"]
  assert faults == ([] if not schedule else ["corrupt", "quarantine", "crash", "rejoin"])
  if schedule:  # the crash was raised inside the actor's program and surfaced as the device error it is
    crash = next(r for r in remote if r.get("fault") == "crash")
    assert "SliceCrash: injected crash of learner 1's slice" in crash["detail"]
    assert_data_accounted(results["ray"], seq_len=64)
    assert len(results["ray"].details["merged_serials"]) == results["ray"].tokens // 64  # (the smoke's seq_len)
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
  remote, result = _same_as_in_process(tmp_path, "crash:learner=1,time=25,repair=10;corrupt:learner=0,time=12,how=flip",
                                       **{"compression.up": "int8", "compression.down": "int8"})
  assert [r["fault"] for r in remote if r["kind"] == "fault"] == ["corrupt", "quarantine", "crash", "rejoin"]
  merge = next(r for r in remote if r["kind"] == "merge")  # (its reports' bytes: int8 and scales, not fp32's 4 a value)
  fp32 = 4 * sum(x.size for x in jax.tree.leaves(result.params))
  assert 0 < merge["bytes_up"] < 0.3 * fp32 * merge["num_merged"], merge


@pytest.mark.slow  # CI time (~30 s), as the in-process prepared-data runs
def test_learners_in_actors_read_a_prepared_dataset_from_its_files_as_in_process(cluster, tmp_path, prepared_dataset):
  # A prepared dataset is read from its shards on demand (runtime/data/prepared.py): each actor's stream reopens the
  # files (their paths and length index cross, not the tokens); through a crash, the in-process run bit for bit
  del cluster
  remote, result = _same_as_in_process(tmp_path, "crash:learner=1,time=25,repair=10",
                                       **{"data.path": str(prepared_dataset), "data.assignment": "service"})
  assert [r["fault"] for r in remote if r["kind"] == "fault"] == ["crash", "rejoin"]
  assert result.params["embed"]["embedding"].shape[0] == 512  # (the manifest's vocabulary)
  assert_data_accounted(result, seq_len=64)


@pytest.mark.slow  # ~30 s (the same machinery as the whole-Θ test above; its real-clock kill is in the suite)
def test_streaming_fragments_cross_to_actors_bit_for_bit(cluster, tmp_path):
  # fragments=5 with one overlap step: each report a fragment's tensors, each delivery one fragment's Θ
  del cluster
  remote, _ = _same_as_in_process(tmp_path, "crash:learner=1,time=25,repair=10;corrupt:learner=0,time=12,how=nan",
                                  fragments=5, overlap_steps=1)
  assert len(remote) >= 40
  assert [r["fault"] for r in remote if r["kind"] == "fault"] == ["corrupt", "quarantine", "crash", "rejoin"]


@pytest.mark.parametrize("recovery, spare", [  # (CI time: without a spare, ~32 s, slow; the spare case regroups too)
    pytest.param("reconfigure", False, marks=pytest.mark.slow),
    ("reconfigure", True), pytest.param("restart", True, marks=pytest.mark.slow)])
def test_learners_of_two_slices_in_actors_train_the_in_process_run_bit_for_bit(cluster, tmp_path, recovery, spare):
  # slices_per_learner=2: each actor holds its two slices' devices (a ('slice', 'data') mesh over them); learner 1's
  # slice 1 (slice 3) crashes at t=25: it shrinks onto the other slice and grows back after the repair, in its actor
  # as in process; with one spare slice of five and a 60 s repair, it grows onto the spare (slice 4) instead, in a new
  # actor made for slices 2 and 4 that takes its state over from the old one (the spare reaches it 5 s into its 8 s
  # reconfiguration: it never trains on slice 2 alone, and the state carried is the one on slices 2 and 3); or
  # (restart) it goes down and restarts from Θ on its healthy slice and the spare, in a new actor made for them
  del cluster
  spares = dict(num_devices=5, slices=5) if spare else {}
  remote, result = _same_as_in_process(tmp_path, f"crash:learner=1,time=25,slice=1,repair={60 if spare else 10}",
                                       slices_per_learner=2, **spares,
                                       **{"faults.learner_recovery": recovery,
                                          "faults.reconfig_seconds": 8.0 if spare and recovery == "reconfigure"
                                          else 1.0})
  faults = [(r["fault"], r.get("detail", "")) for r in remote if r["kind"] == "fault"]
  if recovery == "reconfigure":
    assert [f for f, _ in faults] == ["shrink", "expand"] and ("[2, 4]" in faults[1][1]) == spare, faults
  else:
    assert [f for f, _ in faults] == ["crash", "rejoin"] and "4" in faults[1][1], faults
  merged = [r for r in remote if r["kind"] == "merge" and r["time"] > 40]
  assert any(1 in r["merged"] for r in merged), "learner 1 trains on after its move"


def test_a_learner_moved_to_a_spare_slice_trains_in_a_new_actor_the_in_process_run_bit_for_bit(cluster, tmp_path):
  # slices=3: slice 2 is spare. Learner 1's slice crashes at t=25 (repaired after 60 s): the spare reaches it after
  # the swap, in a new actor made for that slice (its book carried over), and the run is the in-process one
  del cluster
  results, pids = {}, {}
  for backend in ("ray", "local"):
    config = _smoke(backend, "crash:learner=1,time=25,repair=60")
    config.num_devices, config.slices = 6, 3
    run = modes.prepare(config)
    controller = Controller(run, Experiment(run), tmp_path / backend, "decoupled")
    pids[backend] = getattr(controller.learners[1], "pids", ())
    results[backend] = controller.train()
    if backend == "ray":
      assert controller.learners[1].slices == (2,) and not set(controller.learners[1].pids) & set(pids["ray"])
  remote = _records(tmp_path / "ray" / "decoupled")
  assert remote == _records(tmp_path / "local" / "decoupled")
  rejoin = [r["detail"] for r in remote if r.get("fault") == "rejoin"]
  assert rejoin == ["on slice 2"], rejoin
  jax.tree.map(np.testing.assert_array_equal, results["ray"].params, results["local"].params)


LENDS = {"data.assignment": "service", "num_devices": 8, "capacity.schedule": "lend:slices=1,time=10,duration=40;random:slices=1,gap=15,"
         "duration=15"}  # two slices lent at most (2 devices each): learners 2 and 3 join, leave and join again


@pytest.mark.slow  # ~60 s
def test_learners_on_lent_slices_join_and_leave_in_actors_as_in_process(cluster, tmp_path):
  # A fixed lend and a random trace's: each lent slice's learner starts in an actor made for that slice, from Θ,
  # leases from the service, leaves (its unreported leases given back) and joins again; a lent learner crashes and
  # another's report is quarantined. Records and Θ are the in-process run's; every window accounted for.
  del cluster
  remote, result = _same_as_in_process(tmp_path, "crash:learner=2,time=25,repair=5;corrupt:learner=3,time=30,how=nan",
                                       **LENDS)
  faults = [(r["fault"], r["learner"]) for r in remote if r["kind"] == "fault"]
  assert faults.count(("join", 2)) == 2 and ("join", 3) in faults and ("crash", 2) in faults, faults
  assert {("leave", 2), ("leave", 3), ("quarantine", 3)} <= set(faults), faults
  assert {m for r in remote if r["kind"] == "merge" for m in r["merged"]} == {0, 1, 2, 3}
  assert_data_accounted(result, seq_len=64)


def test_a_lent_learner_whose_process_is_found_dead_by_its_reclaim_leaves_and_gives_its_leases_back(
    cluster, tmp_path, monkeypatch):
  # The lend's reclaim (t=30) finds learner 2's process ended (killed just before): it is replaced, down, and leaves
  # as in process (its loss booked once, by the leave; its unreported leases given back), and the run trains on.
  del cluster
  config = _smoke("ray")
  config.num_devices, config.data.assignment = 6, "service"  # (2 owned slices and 1 lent, 2 devices each)
  config.capacity.schedule = "lend:slices=1,time=10,duration=20"
  reclaim, killed = Membership.on_reclaim, []

  def kill_then_reclaim(membership, event):
    for s in event.payload[1]:
      learner = controller.learners[controller.slices.lent[s]]
      killed.append((learner.index, learner.pids))
      for member in learner._actor.members:  # pylint: disable=protected-access
        ray.kill(member, no_restart=True)
    reclaim(membership, event)

  monkeypatch.setattr(Membership, "on_reclaim", kill_then_reclaim)
  run = modes.prepare(config)
  controller = Controller(run, Experiment(run), tmp_path, "decoupled")
  result = controller.train()
  records = _records(tmp_path / "decoupled")
  assert [index for index, _ in killed] == [2], killed
  leave = next(r for r in records if r.get("fault") == "leave")
  assert (leave["learner"], leave["time"]) == (2, 30.0) and "process" in leave["detail"], leave
  assert not set(controller.learners[2].pids) & set(killed[0][1])  # (a new actor took its place)
  assert not [r for r in records if r.get("fault") == "crash"]  # (its loss is the leave's, booked once)
  assert 2 in {m for r in records if r["kind"] == "merge" for m in r["merged"]}
  assert result.tokens == run.token_budget
  assert_data_accounted(result, seq_len=64)


@pytest.mark.slow  # ~70 s
def test_a_learner_on_a_spare_slice_resumes_in_an_actor_made_for_it_bit_identical(cluster, tmp_path, monkeypatch):
  # killed before the checkpoints of merges 4 and 5 (learner 1 on spare slice 2 since t=30): each rerun restores
  # learner 1 into a new actor made for slice 2
  del cluster
  config = _smoke("ray", "crash:learner=1,time=25,repair=60")
  config.num_devices, config.slices, config.checkpoint_every = 6, 3, 1
  assert_resumes_bit_identical(config, tmp_path, monkeypatch, kills=(4, 5))
  rejoin = [r["detail"] for r in _records(tmp_path / "killed" / "decoupled") if r.get("fault") == "rejoin"]
  assert rejoin == ["on slice 2"], rejoin


@pytest.mark.slow  # ~60 s
def test_a_learner_grown_onto_a_spare_resumes_in_an_actor_made_for_its_slices_bit_identical(cluster, tmp_path,
                                                                                           monkeypatch):
  # Learner 1 of slices 2 and 3 shrinks onto slice 2 at t=25 and grows onto spare slice 4 at t=46 (its state carried
  # to a new actor); killed before the checkpoints of merges 5 and 7: the first rerun resumes it shrunk (and carries
  # it to the new actor as the run did), the second restores it into a new actor made for slices 2 and 4. The
  # reference is the run in process.
  del cluster
  schedule, fields = "crash:learner=1,time=25,slice=1,repair=60", dict(slices_per_learner=2, num_devices=5, slices=5,
                                                                       checkpoint_every=1)
  config, local = _smoke("ray", schedule), _smoke("local", schedule)
  for c in (config, local):
    c.update(fields)
    c.faults.reconfig_seconds = 1.0
  assert_resumes_bit_identical(config, tmp_path, monkeypatch, kills=(5, 7), reference_config=local)
  records = _records(tmp_path / "killed" / "decoupled")
  expand = next(r for r in records if r.get("fault") == "expand")
  merges = [r["time"] for r in records if r["kind"] == "merge"]
  assert "[2, 4]" in expand["detail"] and merges[3] < expand["time"] < merges[5], (expand, merges)


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.slow)], ids=["actor", "gang"])
def test_the_driver_killed_and_rerun_resumes_with_new_actors_bit_identical(cluster, tmp_path, monkeypatch, processes):
  # Killed as it is about to save the checkpoints of merges 2 and 4, so it resumes from those of merges 1 (before the
  # crash at t=25) and 3 (learner 1 down, its state lost): each rerun restores every learner into new actors (a
  # gang's members each lay out their share of the arrays they are sent). The reference is the run in process (the
  # tests above: the same bits), which saves a third cluster run.
  del cluster
  schedule = "crash:learner=1,time=25,repair=10;corrupt:learner=0,time=12,how=nan"
  config, local = _smoke("ray", schedule, processes=processes), _smoke("local", schedule)
  config.checkpoint_every = local.checkpoint_every = 1
  result = assert_resumes_bit_identical(config, tmp_path, monkeypatch, kills=(2, 4), reference_config=local)
  assert result.extras["faults"] == 2  # (the crash and the corrupt report; their rejoin and quarantine follow)


@pytest.mark.slow  # ~125 s
def test_the_driver_killed_while_slices_are_lent_resumes_with_new_actors_bit_identical(cluster, tmp_path, monkeypatch):
  # Killed before the checkpoints of merges 3 and 6 (slices lent; leases held by lent learners and given back): each
  # rerun restores the service and every learner's leases, on the controller and in new actors
  del cluster
  schedule = "crash:learner=2,time=25,repair=5;corrupt:learner=3,time=30,how=nan"
  config, local = _smoke("ray", schedule), _smoke("local", schedule)
  for c in (config, local):
    c.checkpoint_every, c.num_devices = 1, LENDS["num_devices"]
    c.data.assignment, c.capacity.schedule = "service", LENDS["capacity.schedule"]
  result = assert_resumes_bit_identical(config, tmp_path, monkeypatch, kills=(3, 6), reference_config=local)
  assert_data_accounted(result, seq_len=64)
  records = _records(tmp_path / "killed" / "decoupled")
  merges = [r["time"] for r in records if r["kind"] == "merge"]
  for merge in (3, 6):  # slices were lent when it was killed: more joins than leaves by then
    moves = [r["fault"] for r in records if r.get("fault") in ("join", "leave") and r["time"] <= merges[merge - 1]]
    assert moves.count("join") > moves.count("leave"), (merge, merges, moves)



@pytest.mark.slow  # ~50 s; the suite keeps a gang's training and replacement (test_ray_deaths.py)
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
    ("ray.address", "auto", "'' unless backend is 'ray'"),
    ("ray.hang_seconds", 0.0, "a number of seconds > 0"),
    ("ray.processes_per_learner", 3, "an integer >= 1 that splits each learner's slice evenly"),
])
def test_what_the_ray_backend_has_not_built_is_refused_naming_the_field(field, value, allowed):
  config = _smoke("local" if field == "ray.address" else "ray")
  section, _, name = field.rpartition(".")
  setattr(config[section] if section else config, name, value)
  with pytest.raises(ConfigError) as refused:
    modes.prepare(config)
  assert field in str(refused.value) and allowed in str(refused.value)


def test_a_gang_that_does_not_split_a_lent_slice_is_refused():
  # 8 devices over 2 owned and 2 lent slices: 2 a slice, which 4 processes cannot split (8 / 2 learners could)
  config = _smoke("ray")
  config.num_devices, config.data.assignment, config.ray.processes_per_learner = 8, "service", 4
  config.capacity.schedule = "lend:slices=2,time=10,duration=40"
  with pytest.raises(ConfigError, match="slices 4, lent included: 2 devices each"):
    modes.prepare(config)


@pytest.mark.parametrize("backend, address, allowed", [
    ("local", "", "1 unless backend is 'ray'"),
    ("ray", "", "1 with slices_per_learner 2 (a learner of several slices that loses one moves its state"),
    ("ray", "", "1 with fsdp True and mesh.tensor 1 (a gang's member reads a report from the parameters it holds"),
    ("ray", "127.0.0.1:6379", "1 with ray.address '127.0.0.1:6379' (a gang's processes on several hosts are not built"),
])
def test_a_learner_of_several_processes_is_refused_where_it_is_not_built(backend, address, allowed):
  config = _smoke(backend, processes=2)
  config.ray.address = address
  if "slices_per_learner" in allowed:
    config.slices_per_learner, config.num_devices = 2, 8
  config.fsdp = "fsdp True" in allowed
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
