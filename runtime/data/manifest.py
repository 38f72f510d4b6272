"""A prepared dataset's `manifest.json`: what its shards hold, how they were made, and how to check them.

A directory is a prepared dataset when it holds a manifest of this format. The manifest is written last, once
every shard is complete, so a directory with shards and no manifest is an unfinished preparation, never a
dataset. Reading it checks the format, the version and every field a reader relies on; each failure is one
line naming the manifest and the field. No JAX here: configs are validated before JAX starts.
"""

import hashlib
import json
import os
import pathlib
from typing import Any

from models.config import VOCAB_SIZE
from runtime.errors import DataError

NAME = "manifest.json"
FORMAT = "decoupled-diloco/prepared-tokens"
VERSION = 2  # 2: a document's tokens in records of at most `record_tokens`; 1 (still read): a record per document
READS = (1, 2)
SPLITS = ("train", "eval")
_SHARD_FIELDS = {"file": str, "index": str, "documents": int, "tokens": int, "bytes": int, "sha256": str,
                 "index_sha256": str}


def path_of(data_path: str) -> pathlib.Path | None:
  """The manifest of `data_path` if it names a directory that holds one, else None (not a prepared dataset)."""
  candidate = pathlib.Path(os.path.expanduser(data_path)) / NAME
  return candidate if candidate.is_file() else None


def read(directory: str | os.PathLike) -> dict[str, Any]:
  """The manifest of the prepared dataset in `directory`, every field a reader uses checked."""
  path = pathlib.Path(directory).expanduser() / NAME
  try:
    manifest = json.loads(path.read_text(encoding="utf-8"))
  except OSError as error:
    raise DataError(f"{path}: cannot be read: {error.strerror or error}") from None
  except (ValueError, UnicodeDecodeError) as error:
    raise DataError(f"{path}: does not parse as JSON ({error}); re-run launch.prepare_data") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise DataError(f"{path}: not a prepared-dataset manifest (its 'format' must be {FORMAT!r})")
  version = manifest.get("format_version")
  if type(version) is not int or version not in READS:  # pylint: disable=unidiomatic-typecheck  (not bool, not 1.0)
    raise DataError(f"{path}: format_version {version!r} is not one this version reads (allowed "
                    f"{' or '.join(map(str, READS))}); prepare the dataset again with this version's "
                    "launch.prepare_data")
  if version >= 2 and _field(manifest, "record_tokens", int, path) < 1:
    raise DataError(f"{path}: field 'record_tokens' = {manifest['record_tokens']!r} is invalid: "
                    "allowed an integer >= 1")
  tokenizer = _field(manifest, "tokenizer", dict, path)
  for key in ("kind", "vocab_size", "eod_id"):
    _field(tokenizer, key, str if key == "kind" else int, path, "tokenizer.")
  _field(manifest, "dtype", str, path)
  splits = _field(manifest, "splits", dict, path)
  for split in SPLITS:
    entry = _field(splits, split, dict, path, "splits.")
    for shard in _field(entry, "shards", list, path, f"splits.{split}."):
      for key, kind in (_SHARD_FIELDS | dict(records=int) if version >= 2 else _SHARD_FIELDS).items():
        _field(shard if isinstance(shard, dict) else {}, key, kind, path, f"splits.{split}.shards[].")
  return manifest


def record_tokens(manifest: dict[str, Any]) -> int | None:
  """The most tokens of a document one record holds; None: a record holds a whole document (format version 1)."""
  return manifest.get("record_tokens") if manifest["format_version"] >= 2 else None


def vocab_size(data_path: str) -> int | None:
  """The vocabulary of the prepared dataset at `data_path`; None when it is not one (text read as bytes)."""
  return None if path_of(data_path) is None else read(os.path.expanduser(data_path))["tokenizer"]["vocab_size"]


def vocabulary(data_path: str) -> tuple[int, str]:
  """The vocabulary a model trained on `data_path` has, and why: the prepared dataset's, or 256 bytes."""
  vocab = vocab_size(data_path)
  if vocab is None:
    return VOCAB_SIZE, f"data.path = {data_path!r} is read byte-level"
  return vocab, f"the vocabulary of the prepared dataset data.path = {data_path!r}"


def write(directory: pathlib.Path, manifest: dict[str, Any]) -> None:
  """Writes the manifest atomically: a reader sees no manifest or the whole of it."""
  tmp = directory / f".{NAME}.{os.getpid()}.tmp"
  tmp.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
  os.replace(tmp, directory / NAME)


def digest(manifest: dict[str, Any]) -> str:
  """What a prepared dataset holds, wherever it lies: its tokenizer, dtype and every shard's checksums."""
  content = dict(tokenizer=manifest["tokenizer"], dtype=manifest["dtype"],
                 splits={split: [[s["sha256"], s["index_sha256"]] for s in manifest["splits"][split]["shards"]]
                         for split in SPLITS})
  return hashlib.sha256(json.dumps(content, sort_keys=True).encode("utf-8")).hexdigest()


def sha256_of(path: pathlib.Path) -> str:
  """The file's SHA-256, read in 4 MiB pieces."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  return digest.hexdigest()


def shards(manifest: dict[str, Any]) -> list[dict[str, Any]]:
  """Every shard entry of the manifest, train first."""
  return [shard for split in SPLITS for shard in manifest["splits"][split]["shards"]]


def verify(directory: pathlib.Path, entries: list[dict[str, Any]]) -> None:
  """Raises DataError naming the first shard whose size or checksum is not what `entries` record."""
  for shard in entries:
    for name, checksum in ((shard["file"], shard["sha256"]), (shard["index"], shard["index_sha256"])):
      path = directory / name
      if not path.is_file():
        raise DataError(f"prepared dataset {str(directory)!r}: shard {name} is missing")
      if name == shard["file"] and path.stat().st_size != shard["bytes"]:
        raise DataError(f"prepared dataset {str(directory)!r}: shard {name} has {path.stat().st_size} bytes, "
                        f"its manifest says {shard['bytes']} (truncated or replaced); prepare it again")
      if sha256_of(path) != checksum:
        raise DataError(f"prepared dataset {str(directory)!r}: shard {name} does not match its checksum in "
                        f"{NAME} (damaged); prepare it again (launch.prepare_data keeps the sound shards)")


def _field(owner: dict, key: str, kind: type, path: pathlib.Path, prefix: str = "") -> Any:
  value = owner.get(key)
  if not isinstance(value, kind) or isinstance(value, bool):
    raise DataError(f"{path}: field '{prefix}{key}' = {value!r} is invalid: allowed {kind.__name__}")
  return value
