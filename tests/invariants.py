"""Invariants every Decoupled DiLoCo run must keep, shared by the controller tests."""


def assert_ranges_tile(result, learners=None):
  """Each learner's merged data ranges tile its stream from batch 0: no batch skipped or merged twice."""
  merged = result.details["merged_ranges"]
  for m in (sorted({r[0] for r in merged}) if learners is None else learners):
    ranges = sorted((a, b) for l, a, b in merged if l == m)
    assert ranges and ranges[0][0] == 0, f"learner {m}: {ranges}"
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
      assert start == end, f"learner {m}: gap or overlap in {ranges}"


def assert_data_accounted(result, seq_len: int) -> None:
  """Every serial the data service handed out is merged at most once, held by one learner, or given back."""
  d = result.details
  merged, leased, returned = d["merged_serials"], d["leased_serials"], d["returned_serials"]
  assert len(set(merged)) == len(merged), "a window reached Θ twice"
  assert len(set(leased)) == len(leased), "a window is leased to two learners"
  assert sorted(leased + returned) == list(range(d["frontier"])), "a window was lost"
  assert set(merged) <= set(leased)
  assert len(merged) * seq_len == result.tokens


def assert_records_sane(result) -> None:
  """What every run's records keep: busy fractions and goodput are shares in [0, 1], and, under the virtual clock, the
  records' modeled times never decrease (under the real clock a record's wall time is when its event happened, and
  events on the merge thread and the controller's are logged a little out of order)."""
  times = [r["time"] for r in result.records if "time" in r and result.time_kind == "modeled"]
  for earlier, later in zip(times, times[1:]):
    assert later >= earlier, f"{result.run}: a record at time {later} after one at {earlier}"
  for r in result.records:
    for field in ("busy", "goodput"):
      values = r.get(field)
      for v in values if isinstance(values, list) else [] if values is None else [values]:
        assert 0.0 <= v <= 1.0, f"{result.run}: {r['kind']} record at {r.get('time')}: {field} {values} outside [0, 1]"
  for field in ("busy_mean", "busy_min", "goodput"):
    v = result.extras.get(field)
    assert v is None or v != v or 0.0 <= v <= 1.0, f"{result.run}: {field} {v} outside [0, 1]"
