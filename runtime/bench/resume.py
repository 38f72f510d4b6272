"""Benchmark: what a resume costs, with and without the learners' inner state in checkpoints.

The config's run (under the virtual clock: the same bits every time) trains to its budget with a checkpoint every
`at` merges, once saving the learners' inner state and once not (`checkpoint_learner_state`: a quiet field, so the
two runs train the same bits and differ only in what they save). Each is then resumed from its checkpoint of merge
`at`, in a copy of its run directory that holds that checkpoint alone: what the same command does after a kill at
that merge. Reported: the bytes on disk of each checkpoint of merge `at`, and the final eval loss at equal tokens of
the run never killed and of each resume (with the learners' state it must be the same bits).
"""

import dataclasses
import pathlib
import shutil
import tempfile

from ml_collections import ConfigDict

from runtime.config.run import RunConfig, validate
from runtime.errors import ConfigError
from runtime.experiments.modes import prepare, train_one
from runtime.reporting.summary import summary_table
from runtime.train.harness import Experiment, RunResult

NAME = "resumed"


def _bytes(directory: pathlib.Path) -> int:
  return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _killed_at(run: RunConfig, exp: Experiment, workdir: pathlib.Path, at: int) -> tuple[RunResult, RunResult, int]:
  """The run trained whole in `workdir`, then resumed from its checkpoint of merge `at` in a copy of its directory
  left with that checkpoint alone; (the whole run, the resumed one, the checkpoint's bytes)."""
  whole = train_one(run, exp, workdir / "whole", NAME)
  source, copy = workdir / "whole" / NAME, workdir / "killed" / NAME
  shutil.copytree(source, copy)
  checkpoint = copy / "checkpoints" / str(at)
  if not checkpoint.is_dir():
    saved = sorted(int(p.name) for p in checkpoint.parent.iterdir() if p.name.isdigit())
    raise ConfigError("at", at, f"a merge the run checkpointed (its saves: {saved})")
  for other in checkpoint.parent.iterdir():
    if other != checkpoint:
      shutil.rmtree(other) if other.is_dir() else other.unlink()
  return whole, train_one(run, exp, workdir / "killed", NAME), _bytes(checkpoint)


def run(config: ConfigDict, at: int) -> list[dict]:
  """Both contenders, killed at merge `at`; prints the table and returns its rows."""
  if at < 1:
    raise ConfigError("at", at, "a merge >= 1")
  base = prepare(config)
  base = dataclasses.replace(base, progress=False, tensorboard=False, checkpoint_every=at, checkpoint_seconds=0.0,
                             checkpoint_wall_seconds=0.0, checkpoint_keep=1_000_000)
  if base.clock.kind != "virtual":
    raise ConfigError("clock.kind", base.clock.kind, "'virtual': a resume's loss is compared at the same bits")
  exp = Experiment(base)
  rows = []
  for kept in (True, False):
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as workdir:
      contender = dataclasses.replace(base, checkpoint_learner_state=kept)
      validate(contender)
      whole, resumed, size = _killed_at(contender, exp, pathlib.Path(workdir), at)
    rows.append({"learner state saved": kept, "checkpoint MB": size / 1e6, "tokens": resumed.tokens,
                 "eval loss, never killed": whole.final_eval_loss, "eval loss, resumed": resumed.final_eval_loss,
                 "resumed / never killed": resumed.final_eval_loss / whole.final_eval_loss})
  title = (f"{base.mode} (M={base.learners}, {base.token_budget:,} tokens, seed {base.seed}, virtual clock) killed "
           f"at merge {at} and resumed")
  print(summary_table(rows, list(rows[0]), title=title), flush=True)
  return rows
