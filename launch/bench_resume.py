"""What a resume costs, with and without the learners' inner state in checkpoints: `python -m launch.bench_resume`.

The config's run (virtual clock) trained whole, and resumed from its checkpoint of merge --at as a killed run's rerun
would be, once with checkpoint_learner_state=True and once False: each checkpoint's size and the final eval loss at
equal tokens against the run never killed (docs/results/checkpointing.md). --config.* overrides the config.
"""

from absl import flags

from runtime import cli
from runtime.bench import resume

_CONFIG = cli.define_config("default", "The run to kill and resume: a path or a name.")
_AT = flags.DEFINE_integer("at", 8, "The merge whose checkpoint the run resumes from.")


def main(argv: list[str]) -> None:
  del argv
  cli.guarded(lambda: resume.run(_CONFIG.value, _AT.value))


if __name__ == "__main__":
  cli.run(main)
