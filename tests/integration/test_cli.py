"""The launchers as a user meets them: bad invocations, --help, runs from another directory, what a run writes."""

import json
import os

import pytest

from configs import default
from launcher import FAST, REPO, imported_jax, launch
from runtime import cli
from runtime.config import docs as config_docs
from runtime.errors import UsageError

# (launcher, arguments, what the one-line message must name). The invocations first, then the rest.
BAD = [
    ("train", ["--config.outer.quorum=0"], "outer.quorum"),
    ("train", ["--config.learners=0"], "learners"),
    ("train", ["--config=no_such_config.py"], "--config=no_such_config.py"),
    ("train", ["--config=BAD_SYNTAX"], "syntax error"),
    ("train", ["--config.learner=2"], "did you mean 'learners'"),
    ("train", ["--config.seed=-1"], "seed"),
    ("train", ["--config.learners=1000"], "num_devices (8)"),
    ("train", ["--config.clock.speeds=(1,nan,1,1)"], "clock.speeds"),
    ("train", ["--config.faults.schedule=crash:time=10"], "faults.schedule"),
    ("train", ["--config.faults.schedule=crash:learner=1,time=nan"], "faults.schedule"),
    ("train", ["--config.outer.lr=inf"], "outer.lr"),
    ("train", ["--config.clock.step_seconds=inf"], "clock.step_seconds"),
    ("train", ["--workdir=A_FILE/run"], "--workdir"),
    ("train", ["--config.mode=dp", "--config.faults.schedule=meltdown:learner=0,time=1"], "faults.schedule"),
    ("train", ["--config.seed=abc"], "config.seed"),
    ("train", ["--config.quorum=2"], "did you mean 'outer.quorum'"),
    ("train", ["--config=smoke", "--config.outer.quorom=2"], "did you mean 'outer.quorum'"),
    ("train", ["--config.mode=sync"], "mode"),
    ("train", ["--config.data.learner_batches=(8,8,8,x)"], "data.learner_batches"),
    ("train", ["--config.model.num_heads=3"], "model.num_heads"),
    ("train", ["--config=smoke", "--config.data.path=/no/such/corpus"], "data.path"),
    ("compare", ["--modes=dp,decoupld"], "did you mean 'decoupled'"),
    ("chaos", ["--config.faults.schedule=crash:learner=9,time=1"], "faults.schedule"),
    ("heterogeneity", ["--seeds=zero"], "--seeds"),
    ("heterogeneity", ["--variants=K=2"], "--variants"),
    ("simulate", ["--config.mtbi_years=-1"], "mtbi_years"),
    ("sweep", [], "--sweep"),
    ("sweep", ["--sweep=outr.quorum=1,2"], "did you mean 'outer.quorum'"),
    ("sweep", ["--sweep=outer.quorum=1,9"], "outer.quorum"),
    ("sweep", ["--sweep=outer.quorum=1,2;inner_steps=2", "--sweep_kind=list"], "--sweep"),
    ("bench_merge", ["--learners=0"], "learners"),
    ("benchmark", ["--which=everything"], "--which"),
]
# Runs that must fail before JAX is imported (the rest load the corpus or a simulator first).
BEFORE_JAX = {"train", "compare", "chaos", "sweep"}


@pytest.mark.parametrize("module,args,named", BAD, ids=[f"{m}:{' '.join(a)}" for m, a, _ in BAD])
def test_a_bad_invocation_prints_one_line_naming_the_field_and_exits_2(tmp_path, module, args, named):
  (tmp_path / "A_FILE").write_text("")
  (tmp_path / "bad_syntax.py").write_text("def get_config(:\n  pass\n")
  args = [a.replace("BAD_SYNTAX", str(tmp_path / "bad_syntax.py")).replace("A_FILE", str(tmp_path / "A_FILE"))
          for a in args]
  before_jax = module in BEFORE_JAX and "data.path" not in " ".join(args)
  has_workdir = module not in ("benchmark", "bench_merge") and not any(a.startswith("--workdir") for a in args)
  workdir = [f"--workdir={tmp_path / 'out'}"] if has_workdir else []
  out = launch(module, *args, *workdir, cwd=tmp_path, importtime=before_jax)
  text = out.stdout + out.stderr
  assert out.returncode == 2, text[-2000:]
  assert "Traceback" not in text
  assert named in text
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, out.stderr[-2000:]
  if before_jax:
    assert not imported_jax(out.stderr), "the error came after JAX was imported"


def test_only_usage_errors_are_shortened_an_internal_error_keeps_its_traceback(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.guarded(lambda: cli.config_path("no_such_config"))
  assert exit_info.value.code == cli.USAGE_EXIT
  assert capsys.readouterr().err.startswith("error: --config=no_such_config: no such config file")
  with pytest.raises(ZeroDivisionError):
    cli.guarded(lambda: 1 / 0)


@pytest.mark.parametrize("module", ["train", "compare", "chaos", "heterogeneity", "simulate", "sweep", "benchmark",
                                    "bench_merge"])
def test_help_exits_0_and_lists_the_launchers_flags(tmp_path, module):
  out = launch(module, "--help", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "--workdir" in out.stdout or module in ("benchmark", "bench_merge")
  assert "Traceback" not in out.stdout + out.stderr


def test_train_help_mentions_every_field_of_the_default_config_with_its_meaning(tmp_path):
  out = launch("train", "--help", cwd=tmp_path)
  assert out.returncode == 0
  fields = config_docs.flatten(default.get_config())
  assert len(fields) > 60
  for field in fields:
    assert f"--config.{field}=" in out.stdout, field
  assert "(undocumented)" not in out.stdout
  # Grouped as the config is: the outer section's fields sit together under its heading.
  outer = out.stdout[out.stdout.index("[outer]"):]
  assert outer.index("--config.outer.quorum=") < outer.index("[clock]")


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs").glob("*.py") if p.stem != "__init__"))
def test_every_field_of_every_config_is_documented(name):
  import importlib  # pylint: disable=g-import-not-at-top
  config = importlib.import_module(f"configs.{name}").get_config()
  docs = config_docs.field_docs(REPO / "configs" / f"{name}.py")
  assert [f for f in config_docs.flatten(config) if not docs.get(f)] == []


def test_configs_resolve_by_name_or_path_from_any_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  smoke = str(REPO / "configs" / "smoke.py")
  assert cli.config_path("smoke") == smoke
  assert cli.config_path("smoke.py") == smoke
  assert cli.config_path("configs/smoke.py") == smoke
  assert cli.config_path(os.path.relpath(smoke)) == smoke
  (tmp_path / "mine.py").write_text("")
  assert cli.config_path("mine.py") == str(tmp_path / "mine.py")  # a local file wins over the built-in names
  with pytest.raises(UsageError, match="one of the names .*'smoke'"):
    cli.config_path("smok")


def test_readme_first_command_runs_from_the_repositorys_parent_directory(tmp_path):
  """The README's first command with the config path adjusted; the run describes itself."""
  out = launch("train", f"--config={REPO.name}/configs/smoke.py", f"--workdir={tmp_path / 'run'}",
               "--config.outer.quorum=2", *FAST, cwd=REPO.parent)
  assert out.returncode == 0, out.stderr[-3000:]
  run_dir = tmp_path / "run" / "decoupled"  # a run is named by its mode (or --run_name), not by its overrides
  assert (run_dir / "metrics.jsonl").exists()
  record = json.loads((run_dir / "run.json").read_text())
  assert record["config"]["outer"]["quorum"] == 2 and record["seed"] == 0
  assert record["environment"]["devices_used"] == 2 and record["environment"]["packages"]["jax"]
  assert record["time"].startswith("modeled")
  assert record["data_size"]["files"] > 100 and record["data_size"]["bytes"] > 1e6  # the corpus before max_bytes
  results = json.loads((tmp_path / "run" / "results.json").read_text())
  assert results[0]["run"] == run_dir.name and results[0]["eval_loss"] < 5.6
  assert f"outputs in {tmp_path / 'run'}/" in out.stdout and "run.json" in out.stdout
