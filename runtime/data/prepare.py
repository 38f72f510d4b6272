"""Prepares a dataset: text and JSONL in, tokenized ArrayRecord shards, a tokenizer and `manifest.json` out.

`prepare(PrepareConfig)` plans the input as shards (runtime/data/documents.py), makes or loads the tokenizer,
then writes each shard in a worker: one ArrayRecord file per split (each document's tokens cut into records of at
most `record_tokens`, so a window is read without its whole document), the documents' lengths beside it, each
written under a temporary name and renamed when complete, then a marker with their checksums. A rerun with the
same input and settings keeps every shard whose marker and checksums hold and writes the rest; the manifest is
written last, so a directory is a dataset only once every shard is complete.

Splits: a document is held out for evaluation when a stable hash of its identity falls below `eval_fraction`. If
no document falls there (a small input), the input's first document is held out; if every one does, the first
trains; a single document gives its last `eval_fraction` of tokens to evaluation (as `corpus.load_corpus` does).
"""

import dataclasses
import json
import math
import multiprocessing
import os
import pathlib
import time
from typing import Any

import numpy as np

from runtime.data import corpus, documents as documents_lib, manifest as manifest_lib, tokenizers
from runtime.data import prepare_resume as resume
from runtime.errors import DataError
from runtime import run_lock

# One record per group: any record is read without decoding its neighbours (random access for the loader).
WRITER_OPTIONS = "group_size:1"
RECORD_TOKENS = 4096  # a document's tokens per record: a window of seq_len + 1 reads at most this much more
_ENCODE_BATCH_BYTES = 4 << 20
_TOKENIZER_SAMPLE_BYTES = 256 << 20  # SentencePiece trains on about this much input, spread over the shards
# What the configs/default.py run the summary suggests evaluates on: windows of seq_len + 1 tokens.
_SUGGESTED_SEQ_LEN, _SUGGESTED_EVAL_WINDOWS = 128, 8 * 8


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
  """What `launch.prepare_data` was asked for; the fields that shape the shards are `settings()`."""

  input: str
  output: str
  tokenizer: str = "byte"  # "byte", "sentencepiece", or a path to a .model / tokenizer.json file
  vocab_size: int | None = None  # sentencepiece: the trained vocabulary (default 32768); others: must match
  sentencepiece_type: str = "bpe"
  text_field: str = "text"
  skip_bad_lines: bool = False
  eval_fraction: float = 0.02
  shard_bytes: int = 16 << 20
  record_tokens: int = RECORD_TOKENS
  workers: int = 1
  progress: bool = True
  command: str = ""

  def settings(self) -> dict[str, Any]:
    return dict(tokenizer=self.tokenizer, vocab_size=self.vocab_size, sentencepiece_type=self.sentencepiece_type,
                text_field=self.text_field, skip_bad_lines=self.skip_bad_lines, eval_fraction=self.eval_fraction,
                shard_bytes=self.shard_bytes, record_tokens=self.record_tokens)


def prepare(cfg: PrepareConfig) -> dict[str, Any]:
  """Writes (or finishes) the prepared dataset `cfg.output`; returns its manifest."""
  _validate(cfg)
  started = time.perf_counter()
  out = pathlib.Path(cfg.output).expanduser().resolve()
  shards = documents_lib.plan(cfg.input, cfg.shard_bytes)
  try:
    lock = run_lock.RunLock.take(out.parent, out.name, kind="dataset", flag="--output")
  except OSError as error:
    raise DataError(f"--output = {str(out)!r} cannot be created: {error.strerror or error}") from None
  try:
    for stale in out.glob(".*.tmp*"):  # what an interrupted preparation was writing (this lock excludes others)
      stale.unlink()
    return _prepare(cfg, out, shards, started)
  finally:
    lock.release()


def _prepare(cfg: PrepareConfig, out: pathlib.Path, shards: list[list[documents_lib.Piece]],
             started: float) -> dict[str, Any]:
  state = resume.Preparation(out, {"input": os.path.abspath(os.path.expanduser(cfg.input)) if cfg.input != corpus.STDLIB
                       else corpus.STDLIB, "settings": cfg.settings(), "pieces": documents_lib.signature(shards)})
  tokenizer = state.tokenizer() or state.keep_tokenizer(_make_tokenizer(cfg, shards))
  dtype = np.dtype(np.uint8 if tokenizer.vocab_size <= 256 else np.uint16 if tokenizer.vocab_size <= 65536
                   else np.uint32)
  jobs = [_Job(out, i, len(shards), shards[i], cfg.text_field, cfg.skip_bad_lines, cfg.eval_fraction, dtype.str,
               cfg.record_tokens, state.adjustment(i)) for i in range(len(shards))]
  _run([job for job in jobs if not state.done(job.index)], tokenizer, cfg)
  adjust = _adjustment([state.marker(i) for i in range(len(shards))], cfg.input)
  if adjust is not None:  # a small input: some split is empty, so one shard is written again with a document moved
    index, change = adjust
    state.set_adjustment(index, change)
    _run([dataclasses.replace(jobs[index], adjust=change)], tokenizer, dataclasses.replace(cfg, progress=False))
  markers = [state.marker(i) for i in range(len(shards))]
  manifest = _manifest(cfg, tokenizer, dtype, markers, documents_lib.input_bytes(shards), len(shards))
  manifest_lib.write(out, manifest)
  seconds = time.perf_counter() - started
  manifest["seconds"] = seconds
  return manifest


def _validate(cfg: PrepareConfig) -> None:
  if not 0.0 < cfg.eval_fraction < 1.0:
    raise DataError(f"--eval_fraction = {cfg.eval_fraction!r} is invalid: allowed 0 < eval_fraction < 1")
  if cfg.workers < 1:
    raise DataError(f"--workers = {cfg.workers!r} is invalid: allowed an integer >= 1")
  if cfg.shard_bytes < 1:
    raise DataError(f"--shard_bytes = {cfg.shard_bytes!r} is invalid: allowed an integer >= 1")
  if cfg.record_tokens < 1:
    raise DataError(f"--record_tokens = {cfg.record_tokens!r} is invalid: allowed an integer >= 1")
  if not cfg.text_field:
    raise DataError("--text_field is empty: allowed the name of the JSONL field that holds each document's text")
  if cfg.tokenizer == "byte" and cfg.vocab_size not in (None, 256):
    raise DataError(f"--vocab_size = {cfg.vocab_size} with --tokenizer=byte: allowed 256 or unset (256 bytes)")
  if cfg.tokenizer == "sentencepiece" and cfg.vocab_size is not None and cfg.vocab_size < 260:
    raise DataError(f"--vocab_size = {cfg.vocab_size} is too small for a SentencePiece tokenizer: allowed >= 260 "
                    "(256 byte pieces, the unknown and end-of-document pieces, and at least some merges)")
  if cfg.tokenizer not in tokenizers.KINDS and not os.path.isfile(os.path.expanduser(cfg.tokenizer)):
    raise DataError(f"--tokenizer = {cfg.tokenizer!r} is invalid: allowed one of {tokenizers.KINDS} or the path of "
                    "an existing tokenizer file (a SentencePiece .model or a Hugging Face tokenizer.json)")


def _make_tokenizer(cfg: PrepareConfig, shards: list[list[documents_lib.Piece]]) -> tokenizers.Tokenizer:
  """The byte tokenizer, one trained on (a spread sample of) the input, or the given file, vocabulary checked."""
  if cfg.tokenizer == "byte":
    return tokenizers.ByteTokenizer()
  if cfg.tokenizer == "sentencepiece":
    stride = max(1, math.ceil(documents_lib.input_bytes(shards) / _TOKENIZER_SAMPLE_BYTES))
    sample = (text for shard in shards[::stride] for piece in shard
              for _, text in documents_lib.documents(piece, cfg.text_field, True, documents_lib.Reading()))
    return tokenizers.train_sentencepiece(sample, cfg.vocab_size or 32768, cfg.sentencepiece_type,
                                          threads=cfg.workers)
  tokenizer = tokenizers.from_file(cfg.tokenizer)
  if cfg.vocab_size is not None and cfg.vocab_size != tokenizer.vocab_size:
    raise DataError(f"--vocab_size = {cfg.vocab_size} does not match the tokenizer {cfg.tokenizer!r}, whose "
                    f"vocabulary is {tokenizer.vocab_size}: allowed {tokenizer.vocab_size} or unset")
  return tokenizer


@dataclasses.dataclass(frozen=True)
class _Job:
  """One shard to write: its pieces of input and everything the worker needs besides the tokenizer."""

  out: pathlib.Path
  index: int
  count: int
  pieces: list[documents_lib.Piece]
  text_field: str
  skip_bad_lines: bool
  eval_fraction: float
  dtype: str
  record_tokens: int
  adjust: dict[str, Any]


def _run(jobs: list[_Job], tokenizer: tokenizers.Tokenizer, cfg: PrepareConfig) -> None:
  """Writes `jobs`' shards, in this process or in `cfg.workers` processes, with a progress bar."""
  if not jobs:
    return
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  total = sum(p.end - p.start for job in jobs for p in job.pieces)
  bar = tqdm(total=total, unit="B", unit_scale=True, desc="prepare", disable=not cfg.progress, leave=False)
  counts = _Counts(multiprocessing.get_context("spawn") if cfg.workers > 1 else None)
  started = time.perf_counter()

  def show() -> None:
    rate = max(time.perf_counter() - started, 1e-9)
    bar.n = counts.bytes.value
    bar.set_postfix_str(f"{counts.documents.value / rate:,.0f} docs/s, {counts.tokens.value / rate:,.0f} tokens/s",
                        refresh=True)

  try:
    if cfg.workers == 1:
      for job in jobs:
        _write_shard(job, tokenizer, counts, show)
    else:
      with counts.context.Pool(min(cfg.workers, len(jobs)), initializer=_adopt_counts, initargs=(counts,)) as pool:
        pending = [pool.apply_async(_write_shard_in_worker, (job, tokenizer)) for job in jobs]
        while pending:
          pending[0].wait(0.2)
          show()
          for result in [r for r in pending if r.ready()]:
            result.get()  # raises the worker's error, e.g. a bad JSONL line
            pending.remove(result)
  finally:
    bar.close()


class _Counts:
  """Documents, tokens and input bytes written so far: shared with worker processes when there are any."""

  def __init__(self, context: Any):
    self.context = context
    make = (lambda: context.Value("q", 0)) if context is not None else _Local
    self.documents, self.tokens, self.bytes = make(), make(), make()

  def __getstate__(self) -> dict:
    return {"documents": self.documents, "tokens": self.tokens, "bytes": self.bytes, "context": None}

  def add(self, documents: int, tokens: int, size: int) -> None:
    for value, amount in ((self.documents, documents), (self.tokens, tokens), (self.bytes, size)):
      if hasattr(value, "get_lock"):
        with value.get_lock():
          value.value += amount
      else:
        value.value += amount


class _Local:
  value = 0


_WORKER_COUNTS: _Counts | None = None


def _adopt_counts(counts: _Counts) -> None:
  global _WORKER_COUNTS  # pylint: disable=global-statement
  _WORKER_COUNTS = counts


def _write_shard_in_worker(job: _Job, tokenizer: tokenizers.Tokenizer) -> None:
  _write_shard(job, tokenizer, _WORKER_COUNTS, lambda: None)


def _write_shard(job: _Job, tokenizer: tokenizers.Tokenizer, counts: _Counts, show: Any) -> None:
  """Tokenizes the job's documents into its train and eval files, then writes its marker."""
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=import-outside-toplevel
  names = {s: f"{s}-{job.index:05d}-of-{job.count:05d}.array_record" for s in manifest_lib.SPLITS}
  temps = {s: job.out / f".{names[s]}.{os.getpid()}.tmp" for s in manifest_lib.SPLITS}
  writers = {s: ArrayRecordWriter(str(temps[s]), WRITER_OPTIONS) for s in manifest_lib.SPLITS}
  lengths: dict[str, list[int]] = {s: [] for s in manifest_lib.SPLITS}
  records = dict.fromkeys(manifest_lib.SPLITS, 0)
  first: dict[str, Any] = {"first": None}  # the shard's first document (the input's, in shard 0)
  reading = documents_lib.Reading()

  def write(batch: list[tuple[str, bytes]]) -> None:
    for (identity, _), tokens in zip(batch, tokenizer.encode([text for _, text in batch])):
      if len(tokens) and first["first"] is None:
        first["first"] = identity
      for split, part in _split(identity, tokens, job):
        part = part.astype(job.dtype)
        for start in range(0, len(part), job.record_tokens):
          writers[split].write(part[start:start + job.record_tokens].tobytes())
          records[split] += 1
        if len(part):
          lengths[split].append(len(part))
      counts.add(1, len(tokens), 0)

  batch, size = [], 0
  for piece in job.pieces:
    for document in documents_lib.documents(piece, job.text_field, job.skip_bad_lines, reading):
      batch.append(document)
      size += len(document[1])
      if size >= _ENCODE_BATCH_BYTES:
        write(batch)
        batch, size = [], 0
    counts.add(0, 0, piece.end - piece.start)
    show()
  write(batch)
  marker = dict(first, bad_lines=reading.bad_lines, first_bad=reading.first_bad)
  for split in manifest_lib.SPLITS:
    writers[split].close()
    marker[split] = _finish(job.out, names[split], temps[split], np.asarray(lengths[split], np.int64), records[split])
  path = resume.marker_path(job.out, job.index)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_text(json.dumps(marker))
  os.replace(tmp, path)


def _split(identity: str, tokens: np.ndarray, job: _Job) -> list[tuple[str, np.ndarray]]:
  """Which split the document's tokens go to (both, cut at the tail, for the single document of an input)."""
  if job.adjust.get("split_tail") == identity:
    cut = len(tokens) - max(1, round(len(tokens) * job.eval_fraction))
    return [("train", tokens[:cut]), ("eval", tokens[cut:])]
  held_out = corpus.hash_fraction(identity) < job.eval_fraction or job.adjust.get("eval") == identity
  held_out = held_out and job.adjust.get("train") != identity
  return [("eval" if held_out else "train", tokens)]


def _finish(out: pathlib.Path, name: str, temp: pathlib.Path, lengths: np.ndarray,
            records: int) -> dict[str, Any] | None:
  """Renames a complete split file and writes its lengths beside it; None (and no file) if it holds nothing."""
  if not len(lengths):
    temp.unlink()
    return None
  index = name.replace(".array_record", ".lengths.npy")
  index_tmp = out / f".{index}.{os.getpid()}.tmp.npy"
  np.save(index_tmp, lengths)
  os.replace(index_tmp, out / index)
  os.replace(temp, out / name)
  return dict(file=name, index=index, documents=int(len(lengths)), tokens=int(lengths.sum()), records=records,
              bytes=(out / name).stat().st_size, sha256=manifest_lib.sha256_of(out / name),
              index_sha256=manifest_lib.sha256_of(out / index))


def _adjustment(markers: list[dict[str, Any]], input_path: str) -> tuple[int, dict[str, Any]] | None:
  """The shard to write again, and how, when a split came out empty; None when both splits hold documents."""
  count = {s: sum(m[s]["documents"] for m in markers if m[s] is not None) for s in manifest_lib.SPLITS}
  if count["train"] + count["eval"] == 0:
    bad = sum(m["bad_lines"] for m in markers)
    dropped = f" ({bad} bad JSONL lines dropped)" if bad else ""
    raise DataError(f"--input = {input_path!r} holds no documents{dropped}")
  if count["train"] and count["eval"]:
    return None
  index, identity = next((i, m["first"]) for i, m in enumerate(markers) if m["first"] is not None)
  if count["train"] + count["eval"] == 1:
    return index, {"split_tail": identity}
  return index, {"eval": identity} if count["train"] else {"train": identity}


def _manifest(cfg: PrepareConfig, tokenizer: tokenizers.Tokenizer, dtype: np.dtype, markers: list[dict[str, Any]],
              input_bytes: int, num_shards: int) -> dict[str, Any]:
  splits = {}
  for split in manifest_lib.SPLITS:
    entries = [m[split] for m in markers if m[split] is not None]
    splits[split] = dict(documents=sum(e["documents"] for e in entries), tokens=sum(e["tokens"] for e in entries),
                         shards=entries)
  bad = [m for m in markers if m["bad_lines"]]
  return dict(
      format=manifest_lib.FORMAT, format_version=manifest_lib.VERSION,
      tokenizer=dict(kind=tokenizer.kind, vocab_size=tokenizer.vocab_size, eod_id=tokenizer.eod_id,
                     file=tokenizer.file),
      dtype=dtype.name, record_tokens=cfg.record_tokens, splits=splits,
      input=dict(path=cfg.input, bytes=input_bytes, shards=num_shards,
                 bad_lines_dropped=sum(m["bad_lines"] for m in bad), first_bad_line=bad[0]["first_bad"] if bad else ""),
      settings=cfg.settings(), command=cfg.command,
      created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def summary(manifest: dict[str, Any], output: str) -> str:
  """What a preparation wrote, at what rate, and how to train on it."""
  train, held_out = manifest["splits"]["train"], manifest["splits"]["eval"]
  documents, tokens = train["documents"] + held_out["documents"], train["tokens"] + held_out["tokens"]
  seconds = max(manifest.get("seconds", 0.0), 1e-9)
  tokenizer = manifest["tokenizer"]
  lines = [f"prepared {output}: {documents:,} documents, {tokens:,} tokens (train {train['documents']:,} documents, "
           f"{train['tokens']:,} tokens; eval {held_out['documents']:,}, {held_out['tokens']:,}) in "
           f"{manifest['input']['shards']} shard(s); tokenizer {tokenizer['kind']}, "
           f"vocabulary {tokenizer['vocab_size']:,}",
           f"{manifest['input']['bytes'] / 1e6:,.1f} MB of input in {seconds:,.1f} s: {documents / seconds:,.0f} "
           f"documents/s, {tokens / seconds:,.0f} tokens/s"]
  if manifest["input"]["bad_lines_dropped"]:
    lines.append(f"dropped {manifest['input']['bad_lines_dropped']:,} JSONL line(s) without text (the first: "
                 f"{manifest['input']['first_bad_line']})")
  windows = (held_out["tokens"] + max(held_out["documents"] - 1, 0)) // (_SUGGESTED_SEQ_LEN + 1)
  lines.append(f"eval split kept: {held_out['tokens']:,} tokens, {windows:,} windows of {_SUGGESTED_SEQ_LEN + 1} "
               f"(data.seq_len {_SUGGESTED_SEQ_LEN})" + (
                   f": fewer than the {_SUGGESTED_EVAL_WINDOWS} the default config evaluates on, so its runs evaluate "
                   "on the windows there are (a larger --eval_fraction holds out more)"
                   if windows < _SUGGESTED_EVAL_WINDOWS else ""))
  lines.append(f"train on it: python -m launch.train --config=default --config.data.path={output}")
  return "\n".join(lines)
