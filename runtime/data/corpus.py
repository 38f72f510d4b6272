"""The corpus: text read byte-level into memory and split by file, or a prepared dataset streamed from disk.

`data.path` names text (`stdlib`, a file, a directory or a glob: read once, whole, vocabulary 256) or a directory
that `launch.prepare_data` wrote (recognized by its manifest; runtime/data/prepared.py). Either gives a train and
an eval token stream that the loader cuts into windows the same way.
"""

import dataclasses
import functools
import glob
import hashlib
import os
import pathlib
import re
import sysconfig

import numpy as np

from runtime.data import manifest, prepared
from runtime.errors import DataError

STDLIB = "stdlib"
# NUL does not occur in text, so it marks document boundaries without colliding with content.
SEPARATOR = b"\x00"

_GLOB_MAGIC = re.compile(r"[*?[]")
# Installed packages are not the standard library, and bytecode caches are not text.
_STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_DIR_SKIP_DIRS = frozenset({"__pycache__"})


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Train and eval token streams and how many documents (files) each came from.

  Text: uint8 byte arrays in memory. A prepared dataset: `prepared.TokenSplit`s read from disk.
  """

  train: "np.ndarray | prepared.TokenSplit"
  eval: "np.ndarray | prepared.TokenSplit"
  train_files: int
  eval_files: int


def resolve_files(path: str) -> list[pathlib.Path]:
  """Non-empty files named by `path`: "stdlib", a file, a directory (recursive) or a glob."""
  return resolve(path)[1]


def load_text(path: str, what: str) -> np.ndarray:
  """Every document of a text path (a file, a folder, a glob, a JSONL file) whole, in order, joined by SEPARATOR:
  held-out text to score, not a corpus to split; `what` names the flag that asked for it."""
  if manifest.path_of(path) is not None:
    raise DataError(f"{what} reads a text path whole: {path!r} is a prepared dataset, which keeps its own split")
  return np.frombuffer(SEPARATOR.join(data for _, data in _documents(path, None)), np.uint8)


def load_corpus(path: str, eval_fraction: float, max_bytes: int | None = None) -> Corpus:
  """Reads the files once, capped at `max_bytes`, and splits them into train/eval by path hash; or opens the
  prepared dataset at `path` (its own split; `max_bytes` caps its training tokens' stored bytes)."""
  if manifest.path_of(path) is not None:  # a prepared dataset: its own split and tokenizer
    train, held_out, _ = prepared.load(path, max_bytes)
    return Corpus(train=train, eval=held_out, train_files=train.documents, eval_files=held_out.documents)
  if not 0.0 < eval_fraction < 1.0:
    raise DataError(
        f"data.eval_fraction = {eval_fraction!r} is invalid: allowed 0 < eval_fraction < 1")
  if max_bytes is not None and max_bytes < 1:
    raise DataError(f"data.max_bytes = {max_bytes!r} is invalid: allowed None or an integer >= 1")
  docs = _documents(path, max_bytes)
  if len(docs) == 1:
    # One file has no other file to hold out, so its tail becomes the eval split.
    data = docs[0][1]
    cut = len(data) - max(1, round(len(data) * eval_fraction))
    train, held_out, train_files, eval_files = data[:cut], data[cut:], 1, 1
  else:
    in_eval = [hash_fraction(rel) < eval_fraction for rel, _ in docs]
    if not any(in_eval):
      in_eval[0] = True
    elif all(in_eval):
      in_eval[0] = False
    train = SEPARATOR.join(data for (_, data), e in zip(docs, in_eval) if not e)
    held_out = SEPARATOR.join(data for (_, data), e in zip(docs, in_eval) if e)
    eval_files = sum(in_eval)
    train_files = len(docs) - eval_files
  if len(train) < 2:
    raise DataError(
        f"data.path = {path!r}: the train split has {len(train)} byte(s); "
        "at least 2 are needed for one input and its next-byte target")
  return Corpus(
      train=np.frombuffer(train, dtype=np.uint8),
      eval=np.frombuffer(held_out, dtype=np.uint8),
      train_files=train_files,
      eval_files=eval_files)


def resolve(path: str, field: str = "data.path") -> tuple[pathlib.Path, list[pathlib.Path]]:
  """The root that file identities are relative to, and the sorted non-empty files under it; errors name `field`."""
  if path == STDLIB:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = _walk(root, _STDLIB_SKIP_DIRS, suffix=".py")
    tried = f"Python sources under the standard library {str(root)!r}"
  else:
    expanded = os.path.abspath(os.path.expanduser(path))
    if os.path.isfile(expanded):
      root = pathlib.Path(expanded).parent
      files = [pathlib.Path(expanded)]
      tried = f"the file {expanded!r}"
    elif os.path.isdir(expanded):
      root = pathlib.Path(expanded)
      files = _walk(root, _DIR_SKIP_DIRS, suffix="")
      tried = f"files under the directory {expanded!r} (hidden entries and __pycache__ skipped)"
    elif _GLOB_MAGIC.search(path):
      root = _glob_root(expanded)
      files = [pathlib.Path(p) for p in glob.glob(expanded, recursive=True) if os.path.isfile(p)]
      tried = f"the glob pattern {expanded!r}"
    else:
      raise DataError(
          f"{field} = {path!r}: no such file or directory; allowed {STDLIB!r}, "
          "a file, a directory or a glob pattern (with ** for any depth)")
  if not files:
    raise DataError(f"{field} = {path!r} matched no files; tried {tried}")
  non_empty = sorted(f for f in files if f.stat().st_size > 0)
  if not non_empty:
    raise DataError(
        f"{field} = {path!r}: all {len(files)} matched file(s) are empty; tried {tried}")
  return root, non_empty


def content_digest(path: str) -> str:
  """What the data at `path` is, independent of where it lies: a prepared dataset's tokenizer and shard checksums
  (read from its manifest), or text's file names relative to its root and their bytes. Equal digests train alike."""
  return content_identity(path)[0]


def content_identity(path: str) -> tuple[str, dict[str, int] | None]:
  """content_digest(path), and for text how much is there before data.max_bytes caps it: its files and bytes (None
  for a prepared dataset, which its digest names). Two machines' "stdlib" differ in both: each Python ships its
  own standard library."""
  if manifest.path_of(path) is not None:
    return "prepared:" + manifest.digest(manifest.read(path)), None
  root, files = resolve(path)
  seen = tuple((f.relative_to(root).as_posix(), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
  return _text_digest(root, seen), dict(files=len(seen), bytes=sum(size for _, size, _ in seen))


@functools.lru_cache(maxsize=16)  # a process that starts many runs on one corpus reads it once
def _text_digest(root: pathlib.Path, files: tuple[tuple[str, int, int], ...]) -> str:
  digest = hashlib.sha256()
  for name, _, _ in files:
    digest.update(name.encode("utf-8") + SEPARATOR)
    digest.update(manifest.sha256_of(root / name).encode("ascii"))
  return "text:" + digest.hexdigest()


def _documents(path: str, max_bytes: int | None) -> list[tuple[str, bytes]]:
  """The text documents of a text path, (path relative to its root, contents) in order, up to `max_bytes`."""
  root, files = resolve(path)
  return _text_only(path, _read(root, files, max_bytes))


def _text_only(path: str, docs: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
  """The documents that are text; binary ones (a NUL byte, which text never holds: images, archives, random bytes)
  are left out with one line saying so, and none left is a DataError."""
  text = [doc for doc in docs if SEPARATOR not in doc[1]]
  if len(text) < len(docs):
    first = next(name for name, data in docs if SEPARATOR in data)
    if not text:
      raise DataError(f"data path {path!r} holds no text: its {len(docs)} file(s) are binary (they hold NUL bytes; the "
                      f"first: {first}); allowed text files or a dataset launch.prepare_data wrote")
    print(f"data path {path!r}: {len(docs) - len(text)} of {len(docs)} files are binary (they hold NUL bytes) and are "
          f"left out (the first: {first})", flush=True)
  return text


def _walk(root: pathlib.Path, skip_dirs: frozenset[str], suffix: str) -> list[pathlib.Path]:
  """Regular files under `root` ending in `suffix`, pruning hidden and `skip_dirs` directories."""
  found = []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = [d for d in subdirs if d not in skip_dirs and not d.startswith(".")]
    paths = (pathlib.Path(directory, n) for n in names if n.endswith(suffix) and n[0] != ".")
    found.extend(p for p in paths if p.is_file())
  return found


def _glob_root(pattern: str) -> pathlib.Path:
  """The deepest directory of `pattern` before its first wildcard."""
  parts = pathlib.Path(pattern).parts
  fixed = next(i for i, part in enumerate(parts) if _GLOB_MAGIC.search(part))
  return pathlib.Path(*parts[:fixed])


def _read(root: pathlib.Path, files: list[pathlib.Path],
          max_bytes: int | None) -> list[tuple[str, bytes]]:
  """(path relative to root, contents) in sorted order, stopping once `max_bytes` are read."""
  docs = []
  remaining = -1 if max_bytes is None else max_bytes
  for file in files:
    with open(file, "rb") as f:
      data = f.read(remaining)
    docs.append((file.relative_to(root).as_posix(), data))
    if max_bytes is not None:
      remaining -= len(data)
      if remaining == 0:
        break
  return docs


def hash_fraction(identity: str) -> float:
  """A stable value in [0, 1) from a document's identity (its path); Python's hash() is salted per process."""
  digest = hashlib.blake2b(identity.encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "big") / 2.0**64
