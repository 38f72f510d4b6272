"""A prepared dataset read from disk: each split a token stream served by window, never held in memory.

A split's stream is its documents in order (shard by shard), each followed by the end-of-document id except the
last: for the byte tokenizer exactly the stream `corpus.load_corpus` builds from the same files in memory. The
loader cuts it into windows of seq_len + 1 tokens as the in-memory path does (runtime/data/shards.py), so shards,
the data service, epoch orders and saved positions work on both alike; a window is read from the records it
overlaps, through grain's `ArrayRecordDataSource` (any record read alone): a document's tokens are cut into records
of at most `record_tokens` (a whole document per record in datasets of format version 1).
"""

import pathlib

import numpy as np

from runtime.data import manifest as manifest_lib
from runtime.errors import DataError


class TokenSplit:
  """One split's token stream, read from its shards on demand; `len()` is its number of tokens."""

  def __init__(self, directory: pathlib.Path, entries: list[dict], eod_id: int, dtype: str,
               max_tokens: int | None = None, record_tokens: int | None = None):
    from grain.sources import ArrayRecordDataSource  # pylint: disable=import-outside-toplevel
    self.dtype = np.dtype(dtype)
    self.eod_id = eod_id
    self.documents = sum(e["documents"] for e in entries)
    lengths = [np.load(directory / e["index"]) for e in entries]
    self._lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    if len(self._lengths) != self.documents:
      raise DataError(f"prepared dataset {str(directory)!r}: its length indexes hold {len(self._lengths)} documents, "
                      f"the manifest {self.documents}; prepare it again")
    # Document d occupies [starts[d], starts[d] + lengths[d]); the token after it is the end-of-document id.
    self._starts = np.concatenate([[0], np.cumsum(self._lengths + 1)[:-1]]).astype(np.int64)
    # Document d's tokens [k * record, (k + 1) * record) are record first_record[d] + k (records of a shard's
    # documents in order, shard after shard, as the source numbers them).
    self._record = record_tokens or max(int(self._lengths.max(initial=0)), 1)
    counts = -(-self._lengths // self._record)
    self._first_record = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    for entry, shard_lengths in zip(entries, lengths):
      made = int(np.sum(-(-shard_lengths // self._record)))
      if made != entry.get("records", made):
        raise DataError(f"prepared dataset {str(directory)!r}: shard {entry['file']}'s field 'records' = "
                        f"{entry['records']} does not match its documents' lengths, which make {made} records of "
                        f"{record_tokens} tokens; prepare it again")
    total = int(self._lengths.sum() + max(len(self._lengths) - 1, 0))
    self._length = total if max_tokens is None else min(total, max_tokens)
    self._source = ArrayRecordDataSource([str(directory / e["file"]) for e in entries]) if entries else None
    if self._source is not None and len(self._source) != int(counts.sum()):
      raise DataError(f"prepared dataset {str(directory)!r}: its shards hold {len(self._source)} records, its "
                      f"documents' lengths make {int(counts.sum())}; prepare it again")

  def __len__(self) -> int:
    return self._length

  def read(self, start: int, stop: int) -> np.ndarray:
    """Tokens [start, stop) of the stream (stop <= len)."""
    return self.read_many(np.asarray([start], np.int64), stop - start)[0]

  def read_many(self, starts: np.ndarray, width: int) -> np.ndarray:
    """[len(starts), width]: row i the tokens [starts[i], starts[i] + width) of the stream; a record that several
    rows overlap is read once."""
    out = np.full((len(starts), width), self.eod_id, self.dtype)
    pieces = []  # (row, out offset, record, offset in the record, length)
    for row, start in enumerate(starts.tolist()):
      stop = start + width
      first = int(np.searchsorted(self._starts, start, side="right")) - 1
      last = int(np.searchsorted(self._starts, stop - 1, side="right")) - 1
      for doc in range(first, last + 1):
        begin = int(self._starts[doc])
        lo, hi = max(start, begin), min(stop, begin + int(self._lengths[doc]))
        for k in range((lo - begin) // self._record, (hi - begin - 1) // self._record + 1) if lo < hi else ():
          at = begin + k * self._record  # where record k of the document begins in the stream
          piece_lo, piece_hi = max(lo, at), min(hi, at + self._record)
          pieces.append((row, piece_lo - start, int(self._first_record[doc]) + k, piece_lo - at, piece_hi - piece_lo))
    wanted = sorted({piece[2] for piece in pieces})
    records = {record: self._source[record] for record in wanted}
    for row, at, record, offset, length in pieces:
      out[row, at:at + length] = np.frombuffer(records[record], self.dtype, length, offset * self.dtype.itemsize)
    return out

  def windows(self, seq_len: int) -> "Windows":
    return Windows(self, seq_len + 1)


class Windows:
  """The split's disjoint windows of `width` tokens, indexed like the in-memory [num_windows, width] view."""

  def __init__(self, split: TokenSplit, width: int):
    self._split, self._width = split, width
    self._count = len(split) // width

  def __len__(self) -> int:
    return self._count

  def __getitem__(self, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= self._count):
      raise IndexError(f"window ids must be in [0, {self._count})")
    return self._split.read_many(ids * self._width, self._width)


def load(directory: str, max_bytes: int | None = None) -> tuple[TokenSplit, TokenSplit, dict]:
  """The dataset's train and eval splits, every shard checked against its manifest first; and the manifest.

  `max_bytes` caps the training stream at that many bytes of stored tokens (the evaluation split is whole).
  """
  path = pathlib.Path(directory).expanduser().resolve()
  manifest = manifest_lib.read(path)
  manifest_lib.verify(path, manifest_lib.shards(manifest))
  tokenizer, dtype = manifest["tokenizer"], manifest["dtype"]
  cap = None if max_bytes is None else max_bytes // np.dtype(dtype).itemsize
  train, held_out = (TokenSplit(path, manifest["splits"][s]["shards"], tokenizer["eod_id"], dtype,
                                cap if s == "train" else None, manifest_lib.record_tokens(manifest))
                     for s in manifest_lib.SPLITS)
  if len(train) < 2:
    raise DataError(f"data.path = {directory!r}: the train split has {len(train)} token(s); at least 2 are needed "
                    "for one input and its next-token target")
  return train, held_out, manifest
