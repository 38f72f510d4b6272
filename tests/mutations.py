"""Mutation check of the core's guards: each plausible bug below must make its named test fail.

Run from the repository root:  python tests/mutations.py [NAME ...]   (each mutation runs only its test: seconds
for a unit test, minutes for a run killed and resumed; the whole list takes tens of minutes on 2 cores)

Each mutation is applied to a copy of the working tree, and only the test named for it runs there;
the line printed says CAUGHT (the test failed, as it must) or MISSED. A mutation whose text no longer
appears exactly once in its file is reported as STALE: update it with the code it guards (the default suite's
tests/repository/test_mutations_current.py fails on a stale one first).
"""

import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

_RESUME_TEST = "tests/integration/test_resume.py::test_killed_mid_flight_four_times_the_run_ends_bit_identical_to_one_never_killed"
_GRACE_TEST = ("tests/unit/test_syncer.py::"
               "test_the_quorum_wait_behind_the_adaptive_grace_runs_from_the_fragments_first_waiting_report")
_SHRINK_TEST = ("tests/integration/test_learner_slices.py::"
                "test_losing_one_slice_it_trains_on_with_the_other_and_grows_back_when_the_slice_is_repaired")
_FRAGMENT_ACCOUNTING_TEST = ("tests/integration/test_fragment_accounting.py::"
                             "test_a_fragments_merge_weight_counts_every_step_since_it_was_received_overlap_included")
_CRASHES_IN_FLIGHT_TEST = ("tests/integration/test_parts_in_flight.py::"
                           "test_with_crashes_injected_two_parts_in_flight_train_the_same_theta_as_one_at_a_time")

# name: (file, text, mutated text, the test that must catch it)
MUTATIONS = {
    "rejoin_with_own_old_theta": (
        "runtime/diloco/slices/lifecycle.py",
        "learner.rejoin(where, devices, self.syncer.params,",
        "learner.rejoin(where, devices, self.syncer._history.get(learner.base_version, self.syncer.params),",
        "tests/integration/test_faults.py::test_rejoining_learner_starts_from_the_syncers_current_theta"),
    "no_relative_quarantine": (
        "runtime/diloco/sync/syncer.py", "if ema and norm > self.cfg.quarantine_factor * ema:", "if False:",
        "tests/unit/test_syncer.py::test_a_delta_far_above_the_recent_norm_is_quarantined_below_the_absolute_limit"),
    "lost_work_counted_useful": (
        "runtime/diloco/ledger.py", "    self.lost_seconds += slice_seconds",
        "    self.lost_seconds += slice_seconds\n    self.useful_seconds += slice_seconds",
        "tests/integration/test_faults.py::test_goodput_counts_only_the_work_that_reached_theta"),
    "elastic_dp_never_pays_reconfiguration": (
        "runtime/baselines/dp_faults.py", "clock.wait_until(t + f.reconfig_seconds)", "clock.wait_until(t)",
        "tests/integration/test_dp.py::test_elastic_dp_pays_a_reconfiguration_to_drop_and_to_readd_the_slice"),
    "overlap_overwritten_without_rewind": (
        "runtime/diloco/learner/learner.py",
        "      self._data.restore(self.book.reported_position)  # overlap steps were overwritten: serve their data again\n",
        "", "tests/integration/test_overlap.py::test_overwrite_still_trains_the_overlap_data_again_as_an_ablation"),
    "overlap_progress_dropped": (
        "runtime/diloco/learner/receive.py", "    return carry(theta, local, at_report)\n", "    return theta\n",
        "tests/unit/test_learner.py::test_adopting_theta_carries_the_overlap_progress_onto_it_and_into_the_next_report"),
    "no_second_part_queued": (
        "runtime/diloco/rounds.py", "0 < learner.parts_in_flight() < self._depth and",
        "0 < learner.parts_in_flight() < 1 and",
        "tests/integration/test_parts_in_flight.py::"
        "test_the_queue_never_exceeds_two_parts_and_nothing_is_lost_or_merged_twice"),
    "queued_part_crash_planned_from_the_steps_trained": (
        "runtime/diloco/slices/lifecycle.py",
        "first = learner.total_steps + (learner.steps_in_flight() if ahead else 0)", "first = learner.total_steps",
        _CRASHES_IN_FLIGHT_TEST),
    "part_queued_behind_one_armed_to_crash": (
        "runtime/diloco/slices/lifecycle.py", "return learner.index in self._armed or learner.index in self._surfacing",
        "return learner.index in self._surfacing", _CRASHES_IN_FLIGHT_TEST),
    "program_error_at_a_queued_dispatch_stops_at_once": (
        "runtime/diloco/slices/lifecycle.py", "    if not learner.parts_in_flight() or injection.slice_lost(error):",
        "    if True:",
        "tests/integration/test_program_errors.py::"
        "test_a_program_error_dispatching_a_queued_part_stops_its_learner_when_the_part_ahead_ends"),
    "void_part_books_its_tokens": (
        "runtime/diloco/learner/book.py", "    if not void:\n", "    if True:\n",
        "tests/integration/test_parts_in_flight.py::"
        "test_the_queue_never_exceeds_two_parts_and_nothing_is_lost_or_merged_twice"),
    "report_copied_to_the_host_by_the_controller": (
        "runtime/diloco/learner/learner.py", "    params, payload = self._capture.send()\n",
        "    params, payload = self._capture.send()\n    params = params and tree_transfer.copy_to(params, "
        "jax.sharding.SingleDeviceSharding(jax.devices('cpu')[0]))\n",
        "tests/integration/test_parts_in_flight.py::test_under_the_real_clock_slow_host_copies_never_idle_the_device"),
    "quorum_not_rechecked_when_a_learner_finishes": (
        "runtime/diloco/controller.py",
        "        self.merges.maybe_merge()  # whatever the event changed, a quorum ready now is scheduled here, once\n",
        "        if kind == EventKind.REPORT_ARRIVED:  # (only when a report comes)\n          self.merges.maybe_merge()\n",
        "tests/integration/test_diloco.py::test_a_learner_finishing_its_budget_lowers_the_quorum_and_the_last_reports_merge"),
    "diverging_outer_step_committed": (
        "runtime/diloco/sync/syncer.py", "    if reason:  # Θ would diverge:", "    if False:  # Θ would diverge:",
        "tests/unit/test_syncer.py::"
        "test_an_absurd_outer_step_is_never_committed_and_persistent_failure_names_the_likely_field"),
    "inner_schedule_restarts_on_reset": (
        "runtime/train/programs.py", "opt_state=schedule_at(tx.init(params), step)", "opt_state=tx.init(params)",
        "tests/unit/test_learner.py::test_reset_starts_fresh_inner_state_at_the_learners_own_step"),
    "quorum_strictly_greater": (
        "runtime/diloco/sync/syncer.py", "sum(r.fragment == p for r in self._pending) >= self.quorum(able[p])",
        "sum(r.fragment == p for r in self._pending) > self.quorum(able[p])",
        "tests/unit/test_syncer.py::test_quorum_is_reached_at_exactly_k_reports_and_never_exceeds_the_learners_able"),
    "evaluations_on_the_controller_thread": (
        "runtime/diloco/controller.py", 'background_evals=run.clock.kind == "real"', "background_evals=False",
        "tests/integration/test_real_clock.py::test_evaluating_after_every_merge_does_not_idle_the_learners"),
    "random_tie_order": (
        "runtime/diloco/clock.py", "heapq.heappush(self._heap, (at, self._seq, event))",
        "heapq.heappush(self._heap, (at, __import__('random').random(), event))",
        "tests/unit/test_clock.py::test_virtual_events_pop_in_time_order_and_ties_in_scheduling_order"),
    "config_accepts_non_finite_numbers": (
        "runtime/errors.py",
        "check(ok and (not isinstance(value, float) or math.isfinite(value)), name, value, allowed)",
        "check(ok, name, value, allowed)",
        "tests/unit/test_config.py::test_values_a_user_can_type_that_are_not_allowed"),
    "misspelled_override_not_caught_before_absl": (
        "runtime/cli.py", "      check_overrides(argv[1:], config)\n", "",
        "tests/integration/test_cli.py::test_a_bad_invocation_prints_one_line_naming_the_field_and_exits_2"),
    "help_without_config_fields": (
        "runtime/cli.py", "        print(config_docs.help_text(config, path.partition(\":\")[0]))\n", "",
        "tests/integration/test_cli.py::test_train_help_mentions_every_field_of_the_default_config_with_its_meaning"),
    "sweep_reruns_finished_points": (
        "runtime/experiments/sweep.py",
        "todo = [p for p in points if not (workdir / p.name / summary.RESULTS_FILE).exists()]",
        "todo = list(points)",
        "tests/experiments/test_sweep.py::"
        "test_a_two_by_two_sweep_writes_one_table_and_plot_and_a_second_invocation_skips_finished_points"),
    "checkpoint_digest_ignored": (
        "runtime/checkpoint/store.py", "if digest.read_bytes().strip() != _digest(step_dir).encode():", "if False:",
        "tests/integration/test_checkpoint.py::test_a_damaged_latest_checkpoint_is_skipped_with_a_warning_naming_it"),
    "dp_resume_forgets_the_data_position": (
        "runtime/baselines/dp.py", "      stream.restore(meta[\"data\"])\n", "",
        "tests/integration/test_checkpoint.py::test_a_killed_data_parallel_run_resumes_and_ends_bit_identical_to_an_unkilled_one"),
    "resume_forgets_the_goodput_ledger": (
        "runtime/diloco/ledger.py",
        'self.useful_seconds, self.lost_seconds = saved["useful_seconds"], saved["lost_seconds"]', "pass",
        _RESUME_TEST),
    "resume_forgets_a_link_fault": (
        "runtime/network/links.py", 'self._faults = {m: (until, mode) for m, until, mode in saved["faults"]}', "pass",
        "tests/unit/test_links.py::"
        "test_links_restored_from_a_snapshot_keep_delaying_and_dropping_reports_until_each_fault_ends"),
    "resume_forgets_a_failed_program_in_flight": (
        "runtime/diloco/learner/parts.py", 'failure = saved["failure"] or failure', "failure = failure",
        _RESUME_TEST),
    "resume_zeroes_the_error_feedback_residual": (
        "runtime/wire/uplink.py", 'self.residual = unpacker.tree(saved["residual"], place, where=group)',
        'self.residual = jax.tree.map(lambda r: r * 0, unpacker.tree(saved["residual"], place, where=group))',
        "tests/integration/test_wire_checkpoint.py::test_a_run_compressed_both_ways_killed_and_resumed_ends_bit_identical[topk]"),
    "program_error_retried_as_a_lost_slice": (
        "runtime/diloco/slices/lifecycle.py", "    if injection.slice_lost(error):", "    if True:",
        "tests/integration/test_program_errors.py::"
        "test_a_program_error_at_dispatch_or_when_awaited_stops_its_learner_once_and_the_others_reach_the_budget"),
    "stopped_learner_counted_in_the_quorum": (
        "runtime/diloco/learner/lifecycle.py", "OUT = (DOWN, DONE, FAILED, ABSENT)", "OUT = (DOWN, DONE, ABSENT)",
        "tests/integration/test_program_errors.py::"
        "test_a_program_error_at_dispatch_or_when_awaited_stops_its_learner_once_and_the_others_reach_the_budget"),
    "sim_repair_overlaps_idle_counted_twice": (
        "runtime/sim/model.py",
        "    in_repair_s = (back_at - fail) - idle.measure(origin[unit] + fail, origin[unit] + back_at)",
        "    in_repair_s = back_at - fail",
        "tests/experiments/test_cluster_sim.py::"
        "test_elastic_drop_repair_and_rejoin_cost_exactly_two_reconfigurations_and_the_slices_repair"),
    "sim_checkpoint_phase_not_reset_by_a_restart": (
        "runtime/sim/model.py", "  resume = np.where(same_unit, np.append(0.0, down_to[:-1]), 0.0)",
        "  resume = np.zeros(down_unit.size)",
        "tests/experiments/test_cluster_sim.py::test_data_parallel_restarts_its_checkpoint_phase_when_the_job_comes_back"),
    "sim_jitter_multiplier_dropped": (
        "runtime/sim/model.py", "  goodput = efficiency * rounds * float(useful.sum()) / allocated",
        "  goodput = rounds * float(useful.sum()) / allocated",
        "tests/experiments/test_cluster_sim.py::"
        "test_jitter_costs_a_synchronous_group_its_wait_for_the_slowest_slice_and_lone_slices_nothing"),
    "lent_learner_restarts_its_inner_warmup": (
        "runtime/diloco/membership.py",
        "      learner.join_schedule(self._budget.schedule_step())\n", "",
        "tests/integration/test_membership.py::test_a_lent_learner_joins_where_the_run_stands_in_the_inner_schedule"),
    "quorum_wait_from_the_last_report": (
        "runtime/diloco/sync/syncer.py",
        "self.xi_quorum.update(now - min(r.sent_at for r in self._pending if r.fragment == fragment))",
        "self.xi_quorum.update(now - max(r.sent_at for r in self._pending if r.fragment == fragment))",
        _GRACE_TEST),
    "quorum_wait_from_another_fragments_report": (
        "runtime/diloco/sync/syncer.py",
        "self.xi_quorum.update(now - min(r.sent_at for r in self._pending if r.fragment == fragment))",
        "self.xi_quorum.update(now - min(r.sent_at for r in self._pending))",
        _GRACE_TEST),
    "fragment_marked_at_receipt_not_at_report": (
        "runtime/diloco/sync/fragment_trees.py", "      self.versions[p], self._marks[p] = version, self._at_report\n",
        "      self.versions[p], self._marks[p] = version, (tokens, steps)\n", _FRAGMENT_ACCOUNTING_TEST),
    "fragment_weighted_by_its_rounds_tokens": (
        "runtime/diloco/sync/syncer.py", "weights = averaging.token_weight(*zip(*(r.trained() for r in kept)))",
        "weights = averaging.token_weight(*zip(*((r.tokens, r.steps) for r in kept)))", _FRAGMENT_ACCOUNTING_TEST),
    "error_feedback_residual_never_added": (
        "runtime/wire/uplink.py", "    delta = jax.tree.map(jnp.add, delta, residual)\n", "    pass\n",
        "tests/unit/test_compression.py::test_error_feedback_conserves_what_was_sent_plus_the_residual[int4-extra0]"),
    "restart_keeps_the_error_feedback_residual": (
        "runtime/wire/uplink.py", "if self.cfg.error_feedback and not (keep_residual and self.residual is not None):",
        "if self.cfg.error_feedback and self.residual is None:",
        "tests/unit/test_compression.py::test_error_feedback_conserves_what_was_sent_plus_the_residual[int4-extra0]"),
    "mirror_assumes_theta_arrived_uncompressed": (
        "runtime/wire/downlink.py", "    mirror = _add(_host(base), self.codec.decode(parts))\n",
        "    mirror = _host(theta)\n",
        "tests/integration/test_theta_down.py::test_every_theta_a_learner_adopts_equals_the_syncers_mirror_bit_for_bit[int4]"),
    "data_service_forgets_given_back_serials": (
        "runtime/data/service.py", "      self._returned.extend(int(s) for s in serials)\n", "      pass\n",
        "tests/unit/test_data_service.py::test_serials_are_never_handed_to_two_holders_and_none_is_lost"),
    "leased_stream_keeps_what_it_gave_back": (
        "runtime/data/service.py", "      self._leases = self._leases[:cut]\n", "",
        "tests/unit/test_data_service.py::"
        "test_a_leased_stream_serves_only_leased_batches_and_gives_back_what_it_never_trains"),
    "shrink_pays_no_reconfiguration": (
        "runtime/diloco/slices/several_slices.py",
        "self._clock.after(self._run.faults.reconfig_seconds, Event(EventKind.RECONFIGURED, m, resume))",
        "self._clock.after(0.0, Event(EventKind.RECONFIGURED, m, resume))", _SHRINK_TEST),
    "shrunk_learner_steps_as_fast_as_a_full_one": (
        "runtime/diloco/slices/lifecycle.py", "return self.run.slices_per_learner / len(learner.slices)", "return 1.0",
        "tests/integration/test_shrunk_learner_timing.py::"
        "test_a_learner_shrunk_to_one_of_its_two_slices_takes_twice_as_long_per_step"),
    "snapshot_places_one_tree_for_every_placement": (
        "runtime/checkpoint/snapshot.py", "key = (tuple(encoded[\"keys\"]), where)",
        "key = (tuple(encoded[\"keys\"]),)",
        "tests/unit/test_snapshot.py::test_shared_arrays_are_stored_once_and_unpacked_once_per_placement"),
    "checkpoint_digest_reads_only_the_first_mib": (
        "runtime/checkpoint/store.py",
        "      for block in iter(lambda: f.read(1 << 20), b\"\"):\n        sha.update(block)\n",
        "      sha.update(f.read(1 << 20))\n",
        "tests/integration/test_checkpoint.py::test_a_byte_flipped_deep_inside_a_large_file_makes_the_checkpoint_skipped"),
    # The owners of redesign III
    "failed_learner_may_wait_again": (
        "runtime/diloco/learner/lifecycle.py", "    FAILED: {DONE},  # never again", "    FAILED: {DONE, WAITING},",
        "tests/unit/test_learner_book.py::test_a_move_outside_the_lifecycles_table_is_refused_naming_both_statuses"),
    "lost_tokens_wake_no_finished_learner": (
        "runtime/diloco/budget.py", "        learner.wait(self._clock.now())\n", "",
        "tests/unit/test_rounds.py::"
        "test_lost_tokens_go_back_into_the_budget_and_a_finished_learner_pulls_theta_to_train_them"),
    "lost_tokens_never_back_in_the_budget": (
        "runtime/diloco/budget.py", "    self.tokens_dispatched -= tokens\n", "",
        "tests/unit/test_rounds.py::"
        "test_lost_tokens_go_back_into_the_budget_and_a_finished_learner_pulls_theta_to_train_them"),
    "a_part_left_unrestored": (
        "runtime/diloco/durability.py", "      part.restore(meta[key], unpacker)",
        "      part.restore(meta[key], unpacker) if key != \"log\" else None",
        "tests/unit/test_durability.py::test_a_checkpoint_hands_every_part_its_own_saved_state_back"),
    "first_layout_loses_the_lent_slices": (
        "runtime/diloco/durability.py", 'lent=membership["lent"])', "lent=[])",
        "tests/unit/test_durability.py::"
        "test_a_checkpoint_of_the_first_layout_resumes_with_each_owners_state_under_its_key"),
    "lent_map_not_saved": (
        "runtime/diloco/slices/lifecycle.py", "lent=sorted(self.lent.items()),", "lent=[],",
        "tests/unit/test_membership_lends.py::"
        "test_the_lent_slices_and_the_traces_drawn_survive_a_snapshot_each_with_its_owner"),
    "stop_saves_a_running_merge": (
        "runtime/diloco/controller.py", "      if preemption.requested() and self.merges.state != RUNNING:",
        "      if preemption.requested():",
        "tests/integration/test_preemption.py::"
        "test_a_sigterm_while_a_merge_runs_stops_once_it_is_done_and_the_resumed_run_ends_bit_identical"),
    "per_round_momentum_ignores_the_fraction": (
        "runtime/diloco/sync/outer_rules.py", "jnp.asarray(decay, jnp.float32) ** share",
        "jnp.asarray(decay, jnp.float32)",
        "tests/unit/test_syncer.py::"
        "test_per_round_momentum_decays_by_mu_per_m_reports_and_equals_per_merge_momentum_for_full_merges"),
    # Asynchrony 2 of 3: the outer rules
    "nesterov_rule_is_heavy_ball": (
        "runtime/diloco/sync/outer_rules.py", "nesterov=cfg.nesterov and cfg.momentum > 0)", "nesterov=False)",
        "tests/unit/test_syncer.py::test_delayed_nesterov_with_a_whole_round_per_merge_is_nesterov"),
    "delayed_nesterov_steps_its_momentum_every_merge": (
        "runtime/diloco/sync/outer_rules.py", "    ends = filled > 1 - ROUND_EPS\n", "    ends = share > 0\n",
        "tests/unit/test_syncer.py::test_delayed_nesterov_follows_the_hand_computation_over_partial_and_crossing_merges"),
    "delayed_nesterov_drops_what_crosses_the_round": (
        "runtime/diloco/sync/outer_rules.py", "buffer=pick(rest, buffer)",
        "buffer=pick(jax.tree.map(jnp.zeros_like, rest), buffer)",
        "tests/unit/test_syncer.py::test_delayed_nesterov_follows_the_hand_computation_over_partial_and_crossing_merges"),
    # Asynchrony 1 of 3: the round plan; the resume of parts queued behind another
    "last_report_overtakes_the_parts_in_flight": (
        "runtime/diloco/round_plan.py", "    if view.in_flight and view.steps_left < 1:",
        "    if False:",
        "tests/unit/test_round_plan.py::"
        "test_the_budgets_last_main_part_is_what_is_left_and_with_nothing_left_the_carried_work_is_reported"),
    "overlap_after_theta_skipped": (
        "runtime/diloco/round_plan.py", "  if view.newest == MAIN:\n", "  if view.newest == MAIN and not view.has_theta:\n",
        "tests/unit/test_round_plan.py::"
        "test_a_round_is_a_main_part_of_h_minus_tau_steps_then_tau_steps_of_overlap_then_theta"),
    "deadline_without_half_a_period": (
        "runtime/diloco/round_plan.py", "math.ceil((self.start + self.period / 2 - self.origin) / self.period)",
        "math.ceil((self.start - self.origin) / self.period)",
        "tests/unit/test_round_plan.py::"
        "test_under_time_a_main_part_trains_until_the_first_deadline_at_least_half_a_period_away"),
    "time_rounds_of_h_steps": (
        "runtime/diloco/round_plan.py", '  if run.rounds.length == "steps" or deadline is None or deadline.period <= 0',
        "  if True or deadline is None or deadline.period <= 0",
        "tests/integration/test_round_lengths.py::"
        "test_fast_learners_take_more_steps_and_the_grace_window_gathers_a_deadlines_reports"),
    "queued_part_forgets_its_wait_on_resume": (
        "runtime/diloco/learner/parts.py", 'queued_seconds=saved.get("queued_seconds", 0.0))', "queued_seconds=0.0)",
        "tests/integration/test_resume.py::test_parts_queued_behind_each_other_resume_bit_identical"),
    "tensor_axis_never_used": (
        "models/lm.py", "if rules.get(name) == \"tensor\" and leaf.shape[axis] % tensor == 0:", "if False:",
        "tests/integration/test_llama_mesh.py::test_a_learners_parameters_are_split_across_tensor_by_their_logical_axes"),
    "cache_ignores_earlier_positions": (
        "models/attention.py", "mask_1x1xLxT = (jnp.arange(keys)[None, :] <= query_positions_L[:, None])[None, None]",
        "mask_1x1xLxT = (jnp.arange(keys)[None, :] == query_positions_L[:, None])[None, None]",
        "tests/integration/test_trained_model.py::"
        "test_sampling_is_deterministic_for_a_seed_and_greedy_sampling_follows_the_full_forward_pass"),
    "user_objective_ignored": (
        "models/lm.py", "  if objective is not None:\n    return objective(", "  if False:\n    return objective(",
        "tests/integration/test_user_model.py::test_a_users_objective_is_what_training_minimizes"),
    "gqa_groups_interleaved": (
        "models/attention.py", "k_BxTxGxK = jnp.repeat(k_BxTxGxK, num_heads // groups, axis=2)",
        "k_BxTxGxK = jnp.tile(k_BxTxGxK, (1, 1, num_heads // groups, 1))",
        "tests/unit/test_model.py::test_grouped_query_attention_matches_a_reference_written_out_head_by_head"),
    "shard_norms_summed_shard_by_shard": (
        "runtime/diloco/sync/shards.py", "    for i in present:\n",
        "    for i in sorted(present, key=self.owner.__getitem__):\n",
        "tests/unit/test_shards.py::test_a_norm_summed_from_each_shards_tensors_is_the_global_norm_bit_for_bit"),
    "mirror_parts_in_shard_order": (
        "runtime/wire/downlink.py", "parts = self.shards.interleave(jax.device_get(per_shard), self._counts)",
        "parts = [x for shard in jax.device_get(per_shard) for x in shard]",
        "tests/unit/test_shards.py::"
        "test_a_syncer_in_four_shards_merges_to_the_same_bits_as_one_and_keeps_each_tensor_on_its_shard"),
    "adopted_theta_kept_for_resend": (
        "runtime/diloco/sync/syncer.py", "    self._unadopted.pop(learner, None)\n\n  def answer",
        "    pass\n\n  def answer",
        "tests/experiments/test_bench.py::"
        "test_the_syncer_keeps_a_copy_of_theta_per_learner_only_where_something_reads_it"),
    "history_kept_without_a_reader": (
        "runtime/diloco/sync/syncer.py", "    read = {self.version}\n    if self._reads_history:",
        "    read = {self.version}\n    if True:",
        "tests/experiments/test_bench.py::"
        "test_the_syncer_keeps_a_copy_of_theta_per_learner_only_where_something_reads_it"),
}


def check(name: str) -> str:
  path, text, mutated, test = MUTATIONS[name]
  with tempfile.TemporaryDirectory() as tmp:
    copy = pathlib.Path(tmp) / "repo"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "__pycache__", "workdirs", "*.egg-info"))
    source = (copy / path).read_text()
    if source.count(text) != 1:
      return f"{name}: STALE ({path} holds its text {source.count(text)} times)"
    (copy / path).write_text(source.replace(text, mutated))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
                             test], cwd=copy, capture_output=True, text=True, check=False)
  return f"{name}: {'CAUGHT' if result.returncode == 1 else 'MISSED'} by {test}"


def main(names: list[str]) -> int:
  lines = []
  for name in names or MUTATIONS:
    lines.append(check(name))
    print(lines[-1], flush=True)  # as each finishes: the whole list runs long
  return 0 if all(" CAUGHT " in line for line in lines) else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
