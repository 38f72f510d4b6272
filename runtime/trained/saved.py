"""The trained model as a run's output: Θ with its names, its config and its tokenizer, loadable in one call.

Every run ends by writing `<run>/model/`: an orbax checkpoint of the parameter tree (`params/`, the model's own
names), `model.json` (the model config, the tokenizer, the run it came from, tokens trained, the final eval loss, a
digest of the arrays) and the tokenizer's file. It is written beside under a temporary name and renamed into place,
so a reader finds the previous model or the new one, never half of one. `save_model_every` also leaves
`<run>/models/merge-<N>/` every N merges. `load_model` reads any of these, or Θ at any merge from a run's
controller checkpoints.
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from models import lm
from models.config import ModelConfig
from runtime.checkpoint import store
from runtime.config.run import RunConfig
from runtime.data import tokenizers
from runtime.errors import DataError

PyTree = Any
FORMAT = "decoupled-diloco/model"
VERSION = 1
MODEL_DIR = "model"
TRAIL_DIR = "models"
MODEL_JSON = "model.json"


def digest(params: PyTree) -> str:
  """SHA-256 over every array of the tree: its path, dtype, shape and bytes, in the tree's order."""
  sha = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    array = np.ascontiguousarray(np.asarray(leaf))
    sha.update(f"{jax.tree_util.keystr(path)}|{array.dtype.name}|{array.shape}\0".encode())
    sha.update(array.tobytes())
  return sha.hexdigest()


def save(directory: pathlib.Path, run: RunConfig, params: PyTree, *, run_name: str, tokens: int,
         eval_loss: float, merge: int | None = None) -> pathlib.Path:
  """Writes the model `params` of `run` to `directory` (`<run>/model`, or `<run>/models/merge-N` with `merge`),
  replacing one there, atomically; returns it."""
  params = jax.device_get(params)
  tokenizer, source = tokenizers.of_data(run.data.path)
  directory = pathlib.Path(directory).resolve()  # (orbax writes only to absolute paths)
  tmp = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  with store.ORBAX_SAVES, ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp / "params", params)
    checkpointer.wait_until_finished()
  if tokenizer.file is not None:
    shutil.copyfile(source / tokenizer.file, tmp / tokenizer.file)
  record = dict(
      format=FORMAT, format_version=VERSION, model=dataclasses.asdict(run.model),
      tokenizer=dict(kind=tokenizer.kind, vocab_size=tokenizer.vocab_size, eod_id=tokenizer.eod_id,
                     file=tokenizer.file),
      run=dict(name=run_name, directory=str(directory.parent if merge is None else directory.parent.parent),
               mode=run.mode, merge=merge),
      data=dict(path=run.data.path, eval_fraction=run.data.eval_fraction, max_bytes=run.data.max_bytes,
                seq_len=run.data.seq_len, eval_batch_size=run.eval_batch,
                eval_batches=run.eval_batches),
      tokens=int(tokens), eval_loss=float(eval_loss), digest=digest(params),
      created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
  (tmp / MODEL_JSON).write_text(json.dumps(record, indent=1, allow_nan=True) + "\n")
  old = directory.with_name(f".{directory.name}.{os.getpid()}.old")
  if directory.exists():
    directory.rename(old)
  tmp.rename(directory)
  shutil.rmtree(old, ignore_errors=True)
  return directory


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A model read back: its config, parameters, tokenizer and what model.json (or the checkpoint) says of it."""

  config: ModelConfig
  params: PyTree
  tokenizer: tokenizers.Tokenizer
  record: dict

  def __iter__(self):  # unpacks as (config, params, tokenizer)
    return iter((self.config, self.params, self.tokenizer))


def load_model(path: str | os.PathLike, merge: int | None = None,
               sharding: jax.sharding.Sharding | None = None) -> Loaded:
  """A trained model: `(config, params, tokenizer) = load_model(path)`.

  `path` is a model directory (holding model.json) or a run directory (its final `model/`); with `merge=N`, a run
  directory's controller checkpoint N (Θ after N merges; checkpoints are numbered by merges). The parameters are
  NumPy arrays on the host, or placed with `sharding` (e.g. a `NamedSharding` replicating them on a mesh).
  Every failure is a DataError of one line: no model there, a digest that does not match, a missing checkpoint.
  """
  root = pathlib.Path(path).expanduser().resolve()
  if merge is not None:
    loaded = _from_checkpoint(root, merge)
  else:
    model_dir = root if (root / MODEL_JSON).is_file() else root / MODEL_DIR
    if not (model_dir / MODEL_JSON).is_file():
      raise DataError(f"no model in {str(root)!r}: allowed a model directory (with {MODEL_JSON}) or a run directory "
                      f"holding {MODEL_DIR}/ (every run writes one when it ends)")
    loaded = _from_model_dir(model_dir)
  if sharding is not None:
    loaded = dataclasses.replace(loaded, params=jax.device_put(loaded.params, sharding))
  return loaded


def _from_model_dir(model_dir: pathlib.Path) -> Loaded:
  record = _read_json(model_dir / MODEL_JSON)
  if record.get("format") != FORMAT or record.get("format_version") != VERSION:
    raise DataError(f"{model_dir / MODEL_JSON}: not a model of this format (allowed format {FORMAT!r}, "
                    f"version {VERSION})")
  config = _model_config(record.get("model"), model_dir / MODEL_JSON)
  like = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), lm.abstract_params(config))
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      params = checkpointer.restore(model_dir / "params", like)
  except Exception as error:  # pylint: disable=broad-except  (orbax wraps what it met in many types)
    raise DataError(f"{model_dir / 'params'}: the parameters cannot be read ({type(error).__name__}: "
                    f"{str(error).splitlines()[0][:200]})") from None
  if digest(params) != record.get("digest"):
    raise DataError(f"{model_dir}: the parameters do not match the digest in {MODEL_JSON} (damaged or replaced)")
  tokenizer = tokenizers.load(record["tokenizer"]["kind"], model_dir)
  return Loaded(config, params, tokenizer, record)


def _from_checkpoint(run_dir: pathlib.Path, merge: int) -> Loaded:
  run_json = run_dir / "run.json"
  if not run_json.is_file():
    raise DataError(f"{str(run_dir)!r} is not a run directory (no run.json): merge= reads a run's checkpoints")
  run = _read_json(run_json)
  if run.get("mode") not in ("decoupled", "diloco_sync"):
    raise DataError(f"run {str(run_dir)!r} is in mode {run.get('mode')!r}: merge= reads the controller checkpoints "
                    f"of modes decoupled and diloco_sync; its final model is in {MODEL_DIR}/")
  config = _model_config(run["config"]["model"], run_json)
  arrays, meta = store.read(run_dir / "checkpoints", merge)
  keys = meta["syncer"]["params"]["keys"]
  params = jax.tree.unflatten(jax.tree.structure(lm.abstract_params(config)), [arrays[k] for k in keys])
  tokenizer, _ = tokenizers.of_data(run["config"]["data"]["path"])
  record = dict(run=dict(name=run.get("name"), directory=str(run_dir), mode=run["mode"], merge=merge),
                tokens=meta["log"]["tokens_merged"], digest=digest(params), data=run["config"]["data"])
  return Loaded(config, params, tokenizer, record)


def _model_config(fields: Any, source: pathlib.Path) -> ModelConfig:
  try:
    return ModelConfig(**fields)
  except TypeError as error:
    raise DataError(f"{source}: its model config does not fit this version's ModelConfig ({error})") from None


def _read_json(path: pathlib.Path) -> dict:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError) as error:
    raise DataError(f"{path}: cannot be read as JSON ({error})") from None


class Trail:
  """`save_model_every`: the model after every N merges, under `<run>/models/merge-<N>/`."""

  def __init__(self, run: RunConfig, run_dir: pathlib.Path | None, run_name: str):
    self._run, self._run_name = run, run_name
    self._directory = None if run_dir is None or not run.save_model_every else run_dir / TRAIL_DIR

  def merged(self, merges: int, params: PyTree, tokens: int, eval_loss: float) -> None:
    if self._directory is not None and merges % self._run.save_model_every == 0:
      save(self._directory / f"merge-{merges}", self._run, params, run_name=self._run_name, tokens=tokens,
           eval_loss=eval_loss, merge=merges)
