"""The start-up benchmark's run: a tiny model and few rounds, so compilation and the controller, not compute, dominate.

Command:  python -m launch.bench_startup
Shows:    start-up time and XLA compilations of Decoupled DiLoCo with M = 4, 16 and 32 learners (one simulated CPU
          device per slice) with the persistent compilation cache cold and warm, the controller's CPU time per
          learner round (target <= 2 ms at M=32), and what a cache key without the device assignment would save.
Runtime:  about 11 minutes on 2 cores, most of it the cold compiles at M=32.
Expected: every slice compiles its own round program when the cache is cold (one per slice, ~5 s each here); a warm
          cache loads them all; the shared key compiles one and ends in the same Θ.
Results:  docs/results/startup.md
"""

from configs import default


def get_config():
  config = default.fixed_rounds(default.paper_outer_step(default.get_config()))
  config.model.size = "tiny"
  config.model.max_len = 32
  config.data.seq_len = 32
  config.data.max_bytes = 400_000
  config.inner_steps = 4
  config.eval_batches = 1
  config.progress = False
  config.tensorboard = False
  return config
