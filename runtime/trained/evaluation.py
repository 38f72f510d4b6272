"""A trained model's loss on any data: nats per token and bits per byte, over every window or the run's own batches.

The data is a text path (read as `corpus.load_corpus` reads it; with a model whose tokenizer is not bytes, each
document is encoded with it) or a prepared dataset, whose tokenizer must be the model's. By default every window of
`seq_len + 1` tokens of the evaluation split is scored (`split="all"`: a text path whole, held-out text the run
never split); `windows="run"` scores exactly the held-out batches the run
evaluated on (`launch.evaluate` then reproduces the run's final eval loss). Bits per byte divide the summed loss by
the UTF-8 bytes the scored tokens stand for, so models with different tokenizers compare.
"""

import math

import jax
import numpy as np

from models.lm import loss_fn
from runtime.data import corpus, manifest as manifest_lib, prepared, shards
from runtime.errors import DataError
from runtime.train.programs import make_eval
from runtime.data import tokenizers
from runtime.trained.saved import Loaded

SPLITS = ("eval", "train", "all")  # "all": a text path whole (held-out text the run never split)
WINDOWS = ("all", "run")


def evaluate(model: Loaded, data_path: str | None = None, *, split: str = "eval", windows: str = "all",
             batch_size: int = 8, max_windows: int = 0, progress: bool = True) -> dict:
  """One row: the model, the data, tokens scored, loss in nats per token, bits per byte."""
  if split not in SPLITS:
    raise DataError(f"--split = {split!r} is invalid: allowed one of {SPLITS}")
  if windows not in WINDOWS:
    raise DataError(f"--windows = {windows!r} is invalid: allowed one of {WINDOWS}")
  if batch_size < 1 or max_windows < 0:
    raise DataError(f"--batch_size = {batch_size}, --max_windows = {max_windows}: allowed >= 1 and >= 0 (0: all)")
  run_data = model.record.get("data") or {}
  data_path = data_path or run_data.get("path")
  if data_path is None:
    raise DataError("--data is required: this model records no data path")
  stream = _stream(model, data_path, split, run_data)
  seq_len = int(run_data.get("seq_len") or model.config.max_len)
  if windows == "run":
    if data_path != run_data.get("path") or split != "eval":
      raise DataError("--windows=run scores the run's own evaluation batches: allowed only with the run's data "
                      f"({run_data.get('path')!r}) and --split=eval")
    batches = shards.eval_batches(stream, batch_size=run_data["eval_batch_size"], seq_len=seq_len,
                                  num_batches=run_data["eval_batches"])
    loss = float(jax.jit(make_eval(model.config))(model.params, batches))
    tokens = batches.shape[0] * batches.shape[1] * seq_len
    nats, scored_bytes = loss * tokens, int(model.tokenizer.byte_lengths()[batches[..., 1:]].sum())
  else:
    nats, tokens, scored_bytes = _score_all(model, stream, seq_len, batch_size, max_windows, progress)
  return dict(model=model.record.get("run", {}).get("name") or "model", data=data_path, split=split,
              windows=windows, tokens=int(tokens), loss=nats / max(tokens, 1),
              bits_per_byte=nats / math.log(2) / max(scored_bytes, 1), train_eval_loss=model.record.get("eval_loss"))


def _stream(model: Loaded, data_path: str, split: str, run_data: dict) -> "np.ndarray | prepared.TokenSplit":
  """The split's token stream, in the model's tokenizer."""
  if split == "all":
    stream = corpus.load_text(data_path, "--split=all")  # (a prepared dataset is refused: it has its own split)
  elif manifest_lib.path_of(data_path) is not None:
    theirs, _ = tokenizers.of_data(data_path)
    ours = model.tokenizer
    if theirs.serialized() != ours.serialized():
      raise DataError(f"--data = {data_path!r} was tokenized with {theirs.kind} ({theirs.vocab_size} ids), the model "
                      f"with {ours.kind} ({ours.vocab_size} ids): allowed data prepared with the model's tokenizer")
    train, held_out, _ = prepared.load(data_path, run_data.get("max_bytes") if split == "train" else None)
    return held_out if split == "eval" else train
  else:
    loaded = corpus.load_corpus(data_path, run_data.get("eval_fraction", 0.02), run_data.get("max_bytes"))
    stream = loaded.eval if split == "eval" else loaded.train
  if model.tokenizer.kind == "byte":
    return stream
  documents = stream.tobytes().split(corpus.SEPARATOR)  # text for a model with its own tokenizer
  encoded = model.tokenizer.encode(documents)
  joined = [part for ids in encoded for part in (ids, np.asarray([model.tokenizer.eod_id]))][:-1]
  return np.concatenate(joined).astype(np.int64)


def _score_all(model: Loaded, stream, seq_len: int, batch_size: int, max_windows: int,
               progress: bool) -> tuple[float, int, int]:
  """Summed loss, tokens and their bytes over every window of the stream (or the first `max_windows`)."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  windows = shards.cut_windows(stream, seq_len, batch_size)
  count = len(windows) if not max_windows else min(max_windows, len(windows))
  if count == 0:
    raise DataError(f"the split has {len(stream)} tokens: fewer than one window of seq_len + 1 = {seq_len + 1}")
  loss = jax.jit(lambda p, b: loss_fn(p, model.config, b))
  byte_lengths = model.tokenizer.byte_lengths()
  nats, scored_bytes = 0.0, 0
  for start in tqdm(range(0, count, batch_size), desc="evaluate", unit="batch", disable=not progress, leave=False):
    batch = np.asarray(windows[np.arange(start, min(start + batch_size, count))], np.int32)
    nats += float(loss(model.params, batch)) * batch.shape[0] * seq_len
    scored_bytes += int(byte_lengths[batch[:, 1:]].sum())
  return nats, count * seq_len, scored_bytes
