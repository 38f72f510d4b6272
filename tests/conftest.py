"""Test set-up: eight simulated CPU devices, configured before any backend starts."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import pytest  # noqa: E402  (after the device set-up above)

# Tests rebuild the same few programs many times; a shared on-disk cache compiles each once.
_CACHE = os.path.join(tempfile.gettempdir(), "decoupled-diloco-test-xla-cache")


def _one_compile_for_all_slices() -> None:
  """Tests only: the persistent cache's key leaves out the device assignment, as JAX's own key does on GPU, so the
  learners' identical round programs on different simulated slices compile once and load for the others (the
  same final Θ: docs/results/startup.md, "key without devices"). It patches a private JAX function; where that
  function has moved, the tests compile per slice again, slower but unchanged."""
  try:
    from jax._src import cache_key  # pylint: disable=g-import-not-at-top
    hash_options = cache_key._hash_serialized_compile_options  # pylint: disable=protected-access
  except (ImportError, AttributeError):
    return
  cache_key._hash_serialized_compile_options = (  # pylint: disable=protected-access
      lambda h, options, strip_device_assignment=False: hash_options(h, options, strip_device_assignment=True))


_one_compile_for_all_slices()


@pytest.fixture(autouse=True)
def _records_sane(monkeypatch):
  """Every run a test trains through `modes` keeps the records' invariants (tests/invariants.py)."""
  from runtime.experiments import modes  # pylint: disable=g-import-not-at-top
  train_in = modes._train_in  # pylint: disable=protected-access

  def checked(*args, **kwargs):
    from invariants import assert_records_sane  # pylint: disable=g-import-not-at-top
    result = train_in(*args, **kwargs)
    assert_records_sane(result)
    return result

  monkeypatch.setattr(modes, "_train_in", checked)


@pytest.fixture
def tiny_config():
  """A seconds-long run on a slice of the real corpus: tiny model, short sequences, no files."""
  return _tiny_config()


@pytest.fixture(scope="session")
def make_tiny_config():
  """`tiny_config` for fixtures wider than one test: call it for a fresh copy."""
  return _tiny_config


def _tiny_config():
  from configs import default  # pylint: disable=g-import-not-at-top

  # Rounds of H steps without overlap: the tests' hand-made expectations (and H = 4 < the default τ) are set by them.
  config = default.fixed_rounds(default.get_config())
  config.model.size = "tiny"
  config.model.d_model = 32
  config.model.mlp_dim = 64
  config.model.max_len = 32
  config.data.seq_len = 32
  config.data.batch_size = 16
  config.data.max_bytes = 400_000
  config.data.prefetch = 2
  config.num_devices = 4
  config.inner_steps = 4
  config.total_steps = 16
  config.eval_every = 8
  config.eval_batches = 1
  config.log_every = 1
  config.progress = False
  config.tensorboard = False
  config.compile_cache = _CACHE
  config.checkpoint_wall_seconds = 0.0  # (on by default; the tests of checkpoints turn them on themselves)
  return config


@pytest.fixture(scope="session")
def text_input(tmp_path_factory):
  """A folder of real text: 30 standard-library modules (a third in a subfolder) and a JSONL file of 12 more."""
  import json  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  import sysconfig  # pylint: disable=g-import-not-at-top

  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  sources = [p for p in sorted(stdlib.glob("*.py")) if 4_000 < p.stat().st_size < 40_000]
  folder = tmp_path_factory.mktemp("text_input")
  (folder / "sub").mkdir()
  for i, source in enumerate(sources[:30]):
    (folder / ("sub" if i % 3 == 0 else "") / source.name).write_bytes(source.read_bytes())
  with open(folder / "docs.jsonl", "w", encoding="utf-8") as out:
    for source in sources[30:42]:
      out.write(json.dumps({"id": source.name, "text": source.read_text(encoding="utf-8")}) + "\n")
  return folder


@pytest.fixture(scope="session")
def prepared_dataset(text_input, tmp_path_factory):
  """`text_input` prepared with a SentencePiece tokenizer of 512 ids trained on it, in three shards."""
  from runtime.data import prepare  # pylint: disable=g-import-not-at-top

  output = tmp_path_factory.mktemp("prepared") / "spm512"
  prepare.prepare(prepare.PrepareConfig(input=str(text_input), output=str(output), tokenizer="sentencepiece",
                                        vocab_size=512, eval_fraction=0.1, shard_bytes=250_000, progress=False))
  return output


def pytest_addoption(parser):
  parser.addoption("--record-golden", action="store_true",
                   help="re-record tests/golden/ from this code (see tests/integration/test_bit_identity.py)")


@pytest.fixture
def sent_payloads(monkeypatch):
  """Every compressed payload the run packs, in order (to check the bytes it accounted)."""
  from runtime.wire import payload as payload_lib  # pylint: disable=g-import-not-at-top

  sent = []
  pack = payload_lib.pack
  monkeypatch.setattr(payload_lib, "pack", lambda parts: sent.append(pack(parts)) or sent[-1])
  return sent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # pylint: disable=unused-argument
  """Under CI (CI=true) a skipped bit-identity guard fails: a guard that skips guards nothing."""
  outcome = yield
  report = outcome.get_result()
  if (os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail")
      and item.path.name == "test_bit_identity.py"):
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = f"the bit-identity guard skipped under CI, where it must run: {reason}"
