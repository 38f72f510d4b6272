"""A run on the pinned route (an accelerator's default; CPU devices have pinned host memory too, and take it when
asked by name) against the same run on the copy route: the same records and Θ, every report staged, the merge free of
implicit transfers."""

import json

import jax
import numpy as np

from runtime.diloco.sync.syncer import Syncer
from runtime.experiments import modes
from runtime.train import tree_transfer


def _records(run_dir):
  return [{k: v for k, v in json.loads(line).items() if k != "wall_time" and not k.startswith("host_")}
          for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_pinned_route_trains_the_copy_routes_run_bit_for_bit_with_no_implicit_transfer_in_a_merge(
    tiny_config, tmp_path, monkeypatch):
  tiny_config.overlap_steps = 2  # (reports copied on the slice, then staged; Θ's overlap progress carried)
  tiny_config.faults.schedule = "crash:learner=1,time=9,repair=4"
  landed, compute, land = [], Syncer.compute, Syncer.land

  def guarded(self, *args, **kwargs):
    with jax.transfer_guard("disallow"):  # every operand already where the merge runs
      return compute(self, *args, **kwargs)

  monkeypatch.setattr(Syncer, "compute", guarded)
  monkeypatch.setattr(Syncer, "land", lambda self, params: landed.append(type(params)) or land(self, params))
  results = {}
  for route in ("pinned", "copy"):
    tiny_config.host_transfers = route
    results[route] = modes.train(tiny_config, tmp_path / route)[0]
    run_json = json.loads((tmp_path / route / "decoupled" / "run.json").read_text())
    assert run_json["environment"]["host_transfers"] == route
    staged = sum(kind is tree_transfer.Staged for kind in landed)
    assert staged == (len(landed) if route == "pinned" else 0) and landed, (route, landed)
    landed.clear()
  assert _records(tmp_path / "pinned" / "decoupled") == _records(tmp_path / "copy" / "decoupled")
  jax.tree.map(np.testing.assert_array_equal, results["pinned"].params, results["copy"].params)
