"""Randomized soak in virtual time: over a hundred faults of every kind per seed, three seeds (and two more with
learners joining and leaving on lent slices).

Run with: python -m pytest -m slow tests/integration/test_soak.py   (several minutes per seed on 2 cores)
"""

import jax
import numpy as np
import pytest

from invariants import assert_data_accounted
from runtime.experiments import modes
from runtime.diloco.controller import Controller
from runtime.train.harness import Experiment


def _random_schedule(rng: np.random.Generator, learners: int, horizon: float, count: int) -> str:
  """`count` faults of every non-crash kind at random times (crashes come from the MTBI trace)."""
  items = []
  for _ in range(count):
    kind = rng.choice(["straggler", "corrupt", "link", "crash"])
    m, t = int(rng.integers(learners)), float(rng.uniform(0, horizon))
    if kind == "straggler":
      items.append(f"straggler:learner={m},time={t:.2f},duration={rng.uniform(1, 20):.2f},"
                   f"factor={rng.uniform(1.5, 4):.2f}")
    elif kind == "corrupt":
      items.append(f"corrupt:learner={m},time={t:.2f},how={rng.choice(['nan', 'inf', 'huge'])}")
    elif kind == "link":
      items.append(f"link:learner={m},time={t:.2f},duration={rng.uniform(1, 10):.2f},"
                   f"mode={rng.choice(['delay', 'drop'])}")
    else:
      items.append(f"crash:learner={m},time={t:.2f},repair={rng.uniform(1, 15):.2f}")
  return ";".join(items)


@pytest.mark.slow
@pytest.mark.parametrize("seed, elastic", [(0, False), (1, False), (2, False), (0, True), (1, True)])
def test_soak_with_hundreds_of_faults_keeps_every_invariant(tiny_config, seed, elastic):
  """`elastic`: learners also join and leave on lent slices (a random trace and a fixed lend), fed by the data
  service, and faults hit them too; no window may be lost or merged twice."""
  c = tiny_config
  c.seed = seed
  c.model.num_layers = 1
  c.data.seq_len = 16
  c.model.max_len = 16
  c.data.batch_size = 8
  c.num_devices = 6
  c.slices = 6  # two spare slices
  c.inner_steps = 3
  c.overlap_steps = 1
  c.total_steps = 120
  c.eval_every = 10_000
  c.clock.jitter = 0.2
  c.outer.quorum = 2
  c.faults.mtbi_chip_seconds = 25_600.0  # a 256-chip slice fails every ~100 s
  c.faults.repair_seconds = 20.0
  c.faults.report_timeout_seconds = 5.0
  c.faults.schedule = _random_schedule(np.random.default_rng(seed), 4, horizon=200.0, count=120)
  if elastic:
    c.num_devices, c.slices = 8, 5  # one spare slice and up to 3 lent
    c.data.assignment = "service"
    c.capacity.schedule = "random:slices=2,gap=15,duration=25;lend:slices=1,time=30,duration=60"
    c.faults.schedule += ";" + _random_schedule(np.random.default_rng(seed + 100), 7, horizon=200.0, count=40)
  run = modes.prepare(c)
  result = Controller(run, Experiment(run), None, "soak").train()

  faults = [f for f in result.details["faults"] if f["fault"] in ("crash", "straggler", "corrupt", "link")]
  assert len(faults) >= 100
  assert result.tokens == run.token_budget
  for m in range(4):
    ranges = sorted((a, b) for l, a, b in result.details["merged_ranges"] if l == m)
    assert ranges and ranges[0][0] == 0
    assert all(prev[1] == nxt[0] for prev, nxt in zip(ranges, ranges[1:])), f"learner {m}: {ranges}"
  merges = [r for r in result.records if r["kind"] == "merge"]
  assert all(np.isfinite(r["update_norm"]) for r in merges)
  assert all(r["quorum"] <= max(r["alive"], 1) for r in merges)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(result.params))
  crashes = sum(f["fault"] == "crash" for f in result.details["faults"])
  rejoins = sum(f["fault"] == "rejoin" for f in result.details["faults"])
  assert crashes - rejoins <= 4  # only learners still under repair at the very end have not rejoined
  assert np.isfinite(result.final_eval_loss)
  if elastic:
    assert_data_accounted(result, seq_len=16)
    joins = sum(f["fault"] == "join" for f in result.details["faults"])
    assert joins >= 5 and result.extras["lent_slice_s"] > 0
