"""Fragments (Streaming DiLoCo): greedy packing covers every tensor once and stays balanced; in a run each report
carries one fragment in turn, each merge moves only its fragment's tensors and outer momentum, bytes on the links
are the fragments' own, P = 1 is the unfragmented runtime, and faults keep the data accounting exact."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from runtime.config import fragment_plan

from runtime.experiments import modes
from runtime.config.run import OuterConfig, from_config_dict
from runtime.diloco.learner import learner as learner_lib
from runtime.diloco.sync import syncer as syncer_lib
from runtime.diloco.sync.fragment_trees import FragmentTrees, fragment_paths
from runtime.diloco.sync.messages import Report
from runtime.errors import ConfigError
from runtime.train.harness import Experiment
from invariants import assert_ranges_tile
from test_resume import FAULTS, assert_resumes_bit_identical


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60), st.integers(1, 12))
def test_packing_puts_every_tensor_in_exactly_one_fragment(sizes, num_fragments):
  groups = fragment_plan.pack(sizes, num_fragments)
  assert len(groups) == num_fragments
  assert sorted(i for g in groups for i in g) == list(range(len(sizes)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60), st.integers(1, 12))
def test_fragments_are_balanced_within_the_largest_tensor(sizes, num_fragments):
  loads = [sum(sizes[i] for i in g) for g in fragment_plan.pack(sizes, num_fragments)]
  assert max(loads) - min(loads) <= max(sizes)


def test_packing_is_deterministic_and_breaks_ties_by_tensor_then_fragment():
  assert fragment_plan.pack([4, 4, 4, 4], 2) == ((0, 2), (1, 3))
  assert fragment_plan.pack([1, 9, 3, 5], 2) == fragment_plan.pack([1, 9, 3, 5], 2) == ((1,), (0, 2, 3))


def test_more_fragments_than_tensors_leaves_some_empty():
  assert fragment_plan.pack([3, 2], 3) == ((0,), (1,), ())


def test_a_fragment_count_below_one_is_a_config_error():
  with pytest.raises(ConfigError, match="fragments"):
    fragment_plan.pack([1], 0)


def test_fragment_paths_name_the_models_tensors():
  tree = {"embed": np.zeros((256, 8)), "blocks": [{"w": np.zeros((8, 32))}, {"w": np.zeros((8, 32))}],
          "out": np.zeros(8)}
  groups = fragment_paths(tree, 2)
  assert sorted(p for g in groups for p in g) == ["blocks/0/w", "blocks/1/w", "embed", "out"]
  assert groups[0] == ("embed",)


@pytest.mark.parametrize("inner_steps,num_fragments", [(24, 24), (30, 4), (10, 3), (5, 1)])
def test_each_fragment_syncs_once_every_h_steps_at_its_staggered_offset(inner_steps, num_fragments):
  steps = range(1, 3 * inner_steps + 1)
  for p in range(num_fragments):
    due = [t for t in steps if fragment_plan.sync_due(t, p, inner_steps, num_fragments)]
    offset = p * inner_steps // num_fragments
    assert fragment_plan.sync_offset(p, inner_steps, num_fragments) == offset
    assert len(due) == 3 and all(t % inner_steps == offset for t in due)
    assert np.all(np.diff(due) == inner_steps)


def test_a_learners_reports_cycle_through_the_fragments_each_due_after_its_inner_steps():
  inner_steps, num = 12, 4
  for n in range(3 * num):
    assert fragment_plan.sync_due((n + 1) * inner_steps // num, fragment_plan.fragment_of(n, num), inner_steps, num)


def _run(config):
  run = modes.prepare(config)
  return modes.train_one(run, Experiment(run), None, "run")


@pytest.fixture
def commits(monkeypatch):
  """Every committed merge: (fragment, Θ and outer state before it, Θ and outer state after it)."""
  log = []
  commit = syncer_lib.Syncer.commit

  def recording(self, result, live):
    before = jax.device_get((self.params, self.opt_state))
    commit(self, result, live)
    if result.merged:
      log.append((result.fragment, *before, *jax.device_get((self.params, self.opt_state))))

  monkeypatch.setattr(syncer_lib.Syncer, "commit", recording)
  return log


def _fragment_of_leaf(params, num):
  groups = FragmentTrees(params, num).groups
  return [next(p for p, g in enumerate(groups) if i in g) for i in range(len(jax.tree.leaves(params)))]


@pytest.mark.parametrize("num,overlap", [pytest.param(2, 1, marks=pytest.mark.slow), (4, 0)])  # CI time
def test_each_merge_moves_only_its_fragments_tensors_and_learners_report_the_fragments_in_turn(
    tiny_config, commits, num, overlap):
  tiny_config.inner_steps, tiny_config.fragments, tiny_config.overlap_steps = 8, num, overlap
  result = _run(tiny_config)
  merges = [r for r in result.records if r["kind"] == "merge"]
  for m in range(tiny_config.learners):  # each learner's n-th report carries fragment (n + 1) mod P
    mine = [r["fragment"] for r in merges for learner in r["merged"] if learner == m]
    assert mine == [fragment_plan.fragment_of(n, num) for n in range(len(mine))]
    assert len(mine) >= tiny_config.total_steps // (tiny_config.inner_steps // num)  # one every H/P steps (+ overlap)
  owner = _fragment_of_leaf(result.params, num)
  assert sorted({f for f, *_ in commits}) == list(range(num))
  for fragment, theta, _, theta_after, _ in commits:
    for leaf, before, after in zip(owner, jax.tree.leaves(theta), jax.tree.leaves(theta_after)):
      assert np.array_equal(before, after) == (leaf != fragment)
  evals = [r["eval_loss"] for r in result.records if r["kind"] == "eval"]
  assert evals[-1] < evals[0] and evals[-1] < np.log(256) - 0.5  # below a uniform guess over bytes


@pytest.mark.slow  # CI time (~14 s on the 2-core host); `pytest -m slow` runs it
def test_a_merge_of_one_fragment_leaves_the_other_fragments_momentum_alone(commits, tiny_config):
  tiny_config.inner_steps, tiny_config.fragments = 8, 2
  _run(tiny_config)
  moved = set()
  for fragment, _, outer, _, outer_after in commits:
    for p in range(2):
      same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(outer[p]), jax.tree.leaves(outer_after[p])))
      assert same == (p != fragment), (fragment, p)
    moved.add(fragment)
  assert moved == {0, 1}


def test_the_syncers_outer_state_is_one_per_fragment_on_that_fragments_tensors():
  cfg = OuterConfig(lr=1.0, momentum=0.9, merge="mean")
  params = {"a": jnp.zeros(4), "b": jnp.zeros(3)}
  syncer = syncer_lib.Syncer(cfg, params, num_learners=2, fragments=2)
  p = next(p for p, g in enumerate(syncer.trees.groups) if g == (0,))  # the fragment of "a"
  local = syncer.trees.part({"a": jnp.full(4, -1.0), "b": jnp.full(3, -1.0)}, p)
  report = Report(0, local, 100, 10, 0, loss=1.0, sent_at=0.0, fragment=p, fragment_tokens=100, fragment_steps=10)
  syncer.commit(syncer.compute([report]), [(-1, 0)])
  np.testing.assert_array_equal(syncer.params["b"], np.zeros(3))
  assert np.all(np.asarray(syncer.params["a"]) < 0)  # toward the learner's -1
  momentum = [jax.tree.leaves(s) for s in syncer.opt_state]
  assert len(momentum[p]) == len(momentum[1 - p]) == 1
  assert np.any(np.asarray(momentum[p][0]) != 0) and np.all(np.asarray(momentum[1 - p][0]) == 0)


def test_each_fragments_quorum_counts_only_the_learners_that_owe_it():
  syncer = syncer_lib.Syncer(OuterConfig(quorum=2), {"a": jnp.zeros(4), "b": jnp.zeros(3)}, 4, fragments=2)
  syncer.receive(Report(0, None, 1, 1, 0, loss=1.0, sent_at=1.0, fragment=1))
  assert syncer.ready([2, 2]) is None  # fragment 1 waits for the second learner that owes it
  assert syncer.ready([3, 1]) == 1  # only one learner owes fragment 1: it merges alone, never deadlocks
  syncer.receive(Report(1, None, 1, 1, 0, loss=1.0, sent_at=0.5, fragment=0))
  syncer.receive(Report(2, None, 1, 1, 0, loss=1.0, sent_at=2.0, fragment=0))
  assert syncer.ready([2, 2]) == 0
  assert [r.learner for r in syncer.take_pending()] == [1, 2]  # the fragment waiting longest
  assert [r.learner for r in syncer.pending] == [0]


@pytest.mark.slow  # CI time (~50 s on the 2-core host); `pytest -m slow` runs it
def test_peak_bytes_in_flight_per_learner_is_about_one_fragment_and_bytes_are_the_fragments_sent(
    tiny_config, monkeypatch):
  tiny_config.model.num_layers = 4  # no tensor above a quarter of the model
  tiny_config.inner_steps, tiny_config.fragments = 8, 4
  tiny_config.clock.merge_seconds = 0.01  # a report has arrived before its merge's Θ goes down
  sent_up, sent_down = [], []
  report, answer = learner_lib.Learner.report, syncer_lib.Syncer.answer
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
  monkeypatch.setattr(learner_lib.Learner, "report", lambda *a: sent_up.append(report(*a)) or sent_up[-1])
  monkeypatch.setattr(syncer_lib.Syncer, "answer", lambda *a: sent_down.append(answer(*a)) or sent_down[-1])
  result = _run(tiny_config)
  full = nbytes(result.params)
  assert result.extras["peak_in_flight_learner"] <= 1.25 / 4 * full
  assert result.extras["bytes_up"] == sum(nbytes(r.params) for r in sent_up)
  assert result.extras["bytes_down"] == sum(nbytes(d.params) for d in sent_down)
  assert len(sent_up) == tiny_config.learners * tiny_config.total_steps // 2
  assert {nbytes(r.params) for r in sent_up} == set(FragmentTrees(result.params, 4).nbytes)


@pytest.mark.slow  # CI time (~15 s); the bit-identity guard's recorded runs cover P = 1 in the default suite
def test_one_fragment_is_the_unfragmented_runtime(tiny_config):
  unset = _run(tiny_config.copy_and_resolve_references())
  tiny_config.fragments = 1
  one = _run(tiny_config)
  for a, b in zip(jax.tree.leaves(unset.params), jax.tree.leaves(one.params)):
    np.testing.assert_array_equal(a, b)
  merges = lambda result: [{k: v for k, v in r.items() if k != "wall_time"} for r in result.records
                           if r["kind"] == "merge"]
  assert merges(unset) == merges(one)
  assert "fragment" not in one.records[-1]
  tree = {"w": np.zeros(3)}
  assert FragmentTrees(tree, 1).part(tree, 0) is tree


@pytest.mark.slow  # CI time (~35 s on the 2-core host); `pytest -m slow` runs it
def test_learners_out_of_phase_merge_their_fragments_without_waiting_for_each_other(tiny_config):
  tiny_config.inner_steps, tiny_config.fragments, tiny_config.overlap_steps = 8, 2, 1
  tiny_config.outer.quorum = 2
  tiny_config.clock.speeds = (1.0, 1.7, 1.0, 2.3)  # reports of different fragments arrive side by side
  budget = modes.prepare(tiny_config).token_budget
  result = _run(tiny_config)
  merges = [r for r in result.records if r["kind"] == "merge"]
  assert {r["fragment"] for r in merges} == {0, 1}
  assert any(r["num_merged"] == 1 for r in merges)  # K = 2 capped by the learners that owe that fragment
  assert_ranges_tile(result)
  assert result.tokens == budget


@pytest.mark.parametrize("mode,schedule", [  # one in the default suite, for CI time (~15 s each)
    ("decoupled", "crash:learner=1,time=3,repair=2"),
    pytest.param("diloco_sync", "crash:learner=1,time=3,repair=2", marks=pytest.mark.slow),
    pytest.param("decoupled", "corrupt:learner=0,time=2,how=nan", marks=pytest.mark.slow),
    pytest.param("decoupled", "link:learner=1,time=3,duration=4,mode=drop", marks=pytest.mark.slow),
])
def test_faults_with_fragments_lose_no_token_and_merge_none_twice(tiny_config, mode, schedule):
  tiny_config.mode, tiny_config.inner_steps, tiny_config.fragments = mode, 8, 2
  tiny_config.learners = tiny_config.num_devices = 2  # (fault injection compiles every learner's programs afresh)
  tiny_config.faults.schedule = schedule
  tiny_config.faults.report_timeout_seconds = 3.0
  budget = modes.prepare(tiny_config).token_budget
  result = _run(tiny_config)
  kinds = {f["fault"] for f in result.details["faults"]}
  assert kinds >= {"crash": {"crash", "rejoin"}, "corrupt": {"quarantine"}, "link": {"link_drop"}}[
      schedule.split(":")[0]]
  assert_ranges_tile(result)
  assert result.tokens == budget
  assert np.isfinite(result.final_eval_loss)


@pytest.mark.parametrize("fields,field", [
    (dict(fragments=3), "fragments"),  # does not divide H = 4
    (dict(fragments=0), "fragments"),
    (dict(fragments=2, overlap_steps=2), "overlap_steps"),  # τ must stay below H/P = 2
    (dict(fragments=2, mode="dp"), "mode"),
    (dict(fragments=2, **{"compression.up": "int4"}), "compression.up"),
    (dict(fragments=2, **{"compression.down": "int8"}), "compression.down"),
])
def test_unsupported_fragment_settings_are_config_errors_naming_the_field(tiny_config, fields, field):
  for name, value in fields.items():
    section, _, key = name.rpartition(".")
    (tiny_config[section] if section else tiny_config)[key] = value
  with pytest.raises(ConfigError) as error:
    from_config_dict(tiny_config)
  assert error.value.field == field


@pytest.mark.slow  # CI time (~30 s without faults, ~10 minutes with them on the loaded 2-core host)
@pytest.mark.parametrize("schedule,kills,steps", [("", (4,), 12), (FAULTS, (5, 11), 24)])
def test_a_run_with_fragments_killed_and_resumed_ends_bit_identical(tiny_config, tmp_path, monkeypatch, schedule,
                                                                     kills, steps):
  """Reports of one fragment in transit and waiting, fragment Θ on its way, per-fragment bases and momentum (with
  faults: ~10 minutes on the loaded 2-core host, hence slow)."""
  tiny_config.learners, tiny_config.num_devices, tiny_config.slices = 3, 4, 4  # one spare slice
  tiny_config.data.batch_size, tiny_config.total_steps = 12, steps
  tiny_config.inner_steps, tiny_config.overlap_steps, tiny_config.fragments = 4, 1, 2
  tiny_config.outer.quorum, tiny_config.clock.latency_s = 2, 0.3
  tiny_config.faults.schedule, tiny_config.faults.report_timeout_seconds = schedule, 3.0
  tiny_config.checkpoint_every = 1
  result = assert_resumes_bit_identical(tiny_config, tmp_path, monkeypatch, kills)
  assert {r["fragment"] for r in result.records if r["kind"] == "merge"} == {0, 1}
  assert_ranges_tile(result, learners=range(3))
