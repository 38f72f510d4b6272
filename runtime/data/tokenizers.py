"""Tokenizers a prepared dataset is made with: bytes, a SentencePiece model trained here, or a given file.

Each maps a document's raw bytes to token ids and marks where documents end with its end-of-document id. A
prepared dataset keeps its tokenizer's file beside the shards, so whoever reads the dataset (training, sampling,
evaluation) decodes with exactly the tokenizer that encoded it. No JAX here: `prepare_data` runs without it.
"""

import io
import pathlib
from typing import Iterable, Iterator, Sequence

import numpy as np

from runtime.data import manifest
from runtime.errors import DataError

KINDS = ("byte", "sentencepiece")  # trained kinds; a path to a `.model` or `tokenizer.json` file is the third way
SENTENCEPIECE_TYPES = ("bpe", "unigram")
# End-of-document tokens a Hugging Face tokenizer may define, in the order they are looked for.
HF_END_TOKENS = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
# SentencePiece trains on pieces of documents no longer than this (its own limit is on one "sentence").
_TRAIN_PIECE_BYTES = 4000
_TRAIN_SENTENCES = 2_000_000


class Tokenizer:
  """Bytes to ids and back; `file` is what a dataset keeps of it (None: nothing to keep)."""

  kind: str
  vocab_size: int
  eod_id: int
  file: str | None = None

  def encode(self, documents: Sequence[bytes]) -> list[np.ndarray]:
    raise NotImplementedError

  def decode(self, ids: Sequence[int]) -> str:
    raise NotImplementedError

  def save(self, directory: pathlib.Path) -> None:
    """Writes the tokenizer's file into `directory` (a dataset, or a model) under `self.file`."""

  def serialized(self) -> bytes:
    """What defines it: two tokenizers with the same bytes here encode every text alike."""
    return self.kind.encode()

  def byte_lengths(self) -> np.ndarray:
    """The UTF-8 bytes each id stands for (the end-of-document id: 1, like the byte stream's separator)."""
    lengths = np.asarray([len(self.decode([i]).encode("utf-8")) for i in range(self.vocab_size)], np.int64)
    lengths[self.eod_id] = 1
    return lengths


class ByteTokenizer(Tokenizer):
  """The 256 byte values; NUL, which text never holds, ends a document (as the byte-level corpus does)."""

  kind, vocab_size, eod_id = "byte", 256, 0

  def encode(self, documents: Sequence[bytes]) -> list[np.ndarray]:
    return [np.frombuffer(d, dtype=np.uint8) for d in documents]

  def decode(self, ids: Sequence[int]) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

  def byte_lengths(self) -> np.ndarray:
    return np.ones(256, np.int64)


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model, held as its serialized proto (so it pickles to worker processes)."""

  kind, file = "sentencepiece", "tokenizer.model"

  def __init__(self, proto: bytes, origin: str):
    import sentencepiece  # pylint: disable=import-outside-toplevel
    self._proto = proto
    self._sp = sentencepiece.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError) as error:
      raise DataError(f"tokenizer {origin!r} is not a SentencePiece model it can read: {error}") from None
    self.vocab_size = self._sp.get_piece_size()
    self.eod_id = self._sp.eos_id()
    if self.eod_id < 0:
      raise DataError(f"tokenizer {origin!r} has no end-of-sentence piece (eos_id = -1); documents need one "
                      "to mark where they end: train it with eos_id >= 0, or use --tokenizer=sentencepiece")

  def __getstate__(self) -> dict:
    return {"proto": self._proto}

  def __setstate__(self, state: dict) -> None:
    self.__init__(state["proto"], "pickled")  # pylint: disable=unnecessary-dunder-call

  def encode(self, documents: Sequence[bytes]) -> list[np.ndarray]:
    texts = [d.decode("utf-8", errors="replace") for d in documents]
    return [np.asarray(ids, np.int64) for ids in self._sp.encode(texts)]

  def decode(self, ids: Sequence[int]) -> str:
    return self._sp.decode([int(i) for i in ids])

  def byte_lengths(self) -> np.ndarray:
    """As pieces: '▁' is a space; a byte-fallback piece is one byte; unknown and control pieces none."""
    sp = self._sp
    piece = lambda i: len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
    lengths = np.asarray([1 if sp.is_byte(i) else 0 if sp.is_control(i) or sp.is_unknown(i) else piece(i)
                          for i in range(self.vocab_size)], np.int64)
    lengths[self.eod_id] = 1
    return lengths

  def save(self, directory: pathlib.Path) -> None:
    (directory / self.file).write_bytes(self._proto)

  def serialized(self) -> bytes:
    return self._proto


class HuggingFaceTokenizer(Tokenizer):
  """A Hugging Face `tokenizer.json`, read by the `tokenizers` library (the `hf` extra)."""

  kind, file = "huggingface", "tokenizer.json"

  def __init__(self, text: str, origin: str):
    try:
      import tokenizers  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise DataError(f"tokenizer {origin!r} is a Hugging Face tokenizer.json; reading it needs the `tokenizers` "
                      "package: pip install -e '.[hf]'") from None
    self._text = text
    try:
      self._tok = tokenizers.Tokenizer.from_str(text)
    except Exception as error:  # the library raises a bare Exception for a file it cannot parse
      raise DataError(f"tokenizer {origin!r} is not a tokenizer.json it can read: {error}") from None
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    found = [t for t in HF_END_TOKENS if self._tok.token_to_id(t) is not None]
    if not found:
      raise DataError(f"tokenizer {origin!r} defines none of the end-of-document tokens {list(HF_END_TOKENS)}")
    self.eod_id = self._tok.token_to_id(found[0])

  def __getstate__(self) -> dict:
    return {"text": self._text}

  def __setstate__(self, state: dict) -> None:
    self.__init__(state["text"], "pickled")  # pylint: disable=unnecessary-dunder-call

  def encode(self, documents: Sequence[bytes]) -> list[np.ndarray]:
    texts = [d.decode("utf-8", errors="replace") for d in documents]
    return [np.asarray(e.ids, np.int64) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids])

  def save(self, directory: pathlib.Path) -> None:
    (directory / self.file).write_text(self._text, encoding="utf-8")

  def serialized(self) -> bytes:
    return self._text.encode("utf-8")


def from_file(path: str | pathlib.Path) -> Tokenizer:
  """An existing tokenizer file, used as given: a SentencePiece `.model` or a Hugging Face `tokenizer.json`."""
  path = pathlib.Path(path).expanduser()
  try:
    data = path.read_bytes()
  except OSError as error:
    raise DataError(f"tokenizer file {str(path)!r} cannot be read: {error.strerror or error}") from None
  if path.suffix == ".json":
    return HuggingFaceTokenizer(data.decode("utf-8", errors="replace"), str(path))
  return SentencePieceTokenizer(data, str(path))


def load(kind: str, directory: pathlib.Path) -> Tokenizer:
  """The tokenizer a dataset or a model directory keeps, by the kind its manifest records."""
  if kind == "byte":
    return ByteTokenizer()
  known = {SentencePieceTokenizer.kind: SentencePieceTokenizer, HuggingFaceTokenizer.kind: HuggingFaceTokenizer}
  if kind not in known:
    raise DataError(f"tokenizer kind {kind!r} in {str(directory)!r} is unknown: allowed 'byte' or one of "
                    f"{sorted(known)}")
  return from_file(directory / known[kind].file)


def of_data(data_path: str) -> tuple[Tokenizer, pathlib.Path | None]:
  """The tokenizer of a run's data (a prepared dataset's, or bytes) and the directory that keeps its file."""
  if manifest.path_of(data_path) is None:
    return ByteTokenizer(), None
  directory = pathlib.Path(data_path).expanduser().resolve()
  return load(manifest.read(directory)["tokenizer"]["kind"], directory), directory


def train_sentencepiece(documents: Iterable[bytes], vocab_size: int, model_type: str = "bpe",
                        threads: int = 1) -> SentencePieceTokenizer:
  """A SentencePiece model trained on `documents`, keeping text exactly (no normalization; bytes fall back).

  Its vocabulary holds the 256 byte pieces (so any text encodes), the unknown and end-of-document pieces, and
  merges learned from the documents: `vocab_size` must leave room for the documents' characters beyond those.
  """
  import sentencepiece  # pylint: disable=import-outside-toplevel
  if model_type not in SENTENCEPIECE_TYPES:
    raise DataError(f"--sentencepiece_type = {model_type!r} is invalid: allowed one of {SENTENCEPIECE_TYPES}")
  proto = io.BytesIO()
  try:
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=_pieces(documents), model_writer=proto, vocab_size=vocab_size, model_type=model_type,
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=False, allow_whitespace_only_pieces=True,
        unk_id=0, eos_id=1, bos_id=-1, pad_id=-1, max_sentence_length=2 * _TRAIN_PIECE_BYTES,
        input_sentence_size=_TRAIN_SENTENCES, shuffle_input_sentence=True, num_threads=threads, minloglevel=2)
  except RuntimeError as error:  # e.g. "Vocabulary size is smaller than required_chars. 300 vs 350."
    raise DataError(f"--vocab_size = {vocab_size}: SentencePiece cannot train a {model_type} model of that size on "
                    f"this input: {str(error).strip().splitlines()[-1]}") from None
  return SentencePieceTokenizer(proto.getvalue(), "trained")


def _pieces(documents: Iterable[bytes]) -> Iterator[str]:
  """Documents as text cut at line ends into pieces of at most ~_TRAIN_PIECE_BYTES (newlines kept)."""
  for document in documents:
    piece, size = [], 0
    for line in document.decode("utf-8", errors="replace").splitlines(keepends=True):
      piece.append(line)
      size += len(line)
      if size >= _TRAIN_PIECE_BYTES:
        yield "".join(piece)
        piece, size = [], 0
    if piece:
      yield "".join(piece)

