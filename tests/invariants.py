"""Invariants every Decoupled DiLoCo run must keep, shared by the controller tests."""


def assert_ranges_tile(result, learners=None):
  """Each learner's merged data ranges tile its stream from batch 0: no batch skipped or merged twice."""
  merged = result.details["merged_ranges"]
  for m in (sorted({r[0] for r in merged}) if learners is None else learners):
    ranges = sorted((a, b) for l, a, b in merged if l == m)
    assert ranges and ranges[0][0] == 0, f"learner {m}: {ranges}"
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
      assert start == end, f"learner {m}: gap or overlap in {ranges}"
