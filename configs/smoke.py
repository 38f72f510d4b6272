"""Smoke test: a tiny Decoupled DiLoCo run that exercises every moving part.

Command:  python -m launch.train --config=configs/smoke.py --workdir=/tmp/smoke
Shows:    4 learners on 8 simulated CPU devices, K=1 merges with RDA, evals of Θ, JSONL/TB/plot.
Runtime:  under ~30 s on 2 cores (mostly compilation).
Expected: eval loss falls from ~5.5 (uniform over 256 bytes) to below ~4 in 60 steps.
Results:  docs/results/asynchrony.md (this config at 120 steps, with four learner speeds)
"""

from configs import default


def get_config():
  config = default.fixed_rounds(default.paper_outer_step(default.get_config()))
  # A tiny model and budget so the whole run is dominated by compilation.
  config.model.size = "tiny"
  config.data.max_bytes = 2_000_000
  config.data.seq_len = 64
  config.model.max_len = 64
  config.inner_steps = 10
  config.total_steps = 60
  config.eval_every = 20
  config.eval_batches = 2
  return config
