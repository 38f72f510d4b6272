"""Learners in Ray actors against learners in the controller's process: `python -m launch.bench_ray`.

For each of --learners (M) and each backend, one real-clock run of the config (configs/smoke.py unless --config;
--config.* overrides it), one simulated CPU device per learner; its row (wall and controller CPU per merge, report
and Θ megabytes per host second) is appended to --rows when it ends, and a cell whose row is there is skipped. The
table is printed at the end (runtime/bench/ray_backend.py). Results: docs/results/ray_backend.md.
"""

from absl import flags

from runtime import cli
from runtime.bench import ray_backend as bench

_DEFAULTS = bench.RayBenchConfig()
_CONFIG = cli.define_config("smoke", "The run each cell makes: a config path or name.")
_ROWS = flags.DEFINE_string("rows", "docs/results/ray_backend_rows.jsonl", "The tracked file the rows go into.")
_LEARNERS = flags.DEFINE_list("learners", [str(m) for m in _DEFAULTS.learners], "Learners (M) of each cell.")
_BACKENDS = flags.DEFINE_list("backends", list(_DEFAULTS.backends), "Backends compared.")
_SKIP = flags.DEFINE_integer("skip", _DEFAULTS.skip, "First merges of each run set aside (compiles, first rounds).")
_MARKDOWN = flags.DEFINE_bool("markdown", False, "Print the table as Markdown (for docs/results).")


def main(argv: list[str]) -> None:
  del argv
  cfg = bench.RayBenchConfig(tuple(cli.integers("learners", _LEARNERS.value)), tuple(_BACKENDS.value), _SKIP.value)
  cli.launch("runtime.bench.ray_backend:main", _CONFIG.value, None, _ROWS.value, cfg, _MARKDOWN.value)


if __name__ == "__main__":
  cli.run(main)
