"""Corpus loading and per-learner batching: splits, shards, epochs, resume and prefetch."""

import json
import pathlib
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.data import corpus
from runtime.data import shards as data
from runtime.errors import DataError


def _write_docs(root: pathlib.Path, count: int) -> dict[bytes, str]:
  """Writes `count` files with distinct contents under nested dirs; maps contents to name."""
  docs = {}
  for i in range(count):
    path = root / f"part{i % 3}" / f"doc{i:02d}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    contents = f"document {i}\n".encode() * (i + 1)
    path.write_bytes(contents)
    docs[contents] = path.name
  return docs


def _eval_names(loaded: corpus.Corpus, docs: dict[bytes, str]) -> set[str]:
  return {docs[d] for d in loaded.eval.tobytes().split(corpus.SEPARATOR)}


# Corpus.


def test_directory_corpus_is_byte_level_and_splits_every_file_to_one_side(tmp_path):
  docs = _write_docs(tmp_path, 20)
  loaded = corpus.load_corpus(str(tmp_path), eval_fraction=0.3)
  assert loaded.train.dtype == np.uint8 and loaded.eval.dtype == np.uint8
  assert loaded.train.ndim == 1 and loaded.train_files > 0 and loaded.eval_files > 0
  assert loaded.train_files + loaded.eval_files == 20
  train_docs = set(loaded.train.tobytes().split(corpus.SEPARATOR))
  eval_docs = set(loaded.eval.tobytes().split(corpus.SEPARATOR))
  assert train_docs | eval_docs == set(docs) and not train_docs & eval_docs


def test_split_depends_only_on_relative_path_not_on_root_or_other_files(tmp_path):
  docs = _write_docs(tmp_path / "a", 20)
  _write_docs(tmp_path / "b", 20)
  before = _eval_names(corpus.load_corpus(str(tmp_path / "a"), 0.3), docs)
  assert _eval_names(corpus.load_corpus(str(tmp_path / "b"), 0.3), docs) == before
  more = _write_docs(tmp_path / "b", 40)
  after = _eval_names(corpus.load_corpus(str(tmp_path / "b"), 0.3), more)
  assert after & set(docs.values()) == before


def test_glob_with_double_star_matches_nested_files_with_the_same_split(tmp_path):
  _write_docs(tmp_path, 12)
  (tmp_path / "notes.md").write_bytes(b"not matched")
  pattern = str(tmp_path / "**" / "*.txt")
  assert len(corpus.resolve_files(pattern)) == 12
  by_glob = corpus.load_corpus(pattern, 0.3)
  (tmp_path / "notes.md").unlink()
  by_directory = corpus.load_corpus(str(tmp_path), 0.3)
  np.testing.assert_array_equal(by_glob.train, by_directory.train)
  np.testing.assert_array_equal(by_glob.eval, by_directory.eval)


def test_directory_skips_hidden_entries_caches_and_empty_files(tmp_path):
  _write_docs(tmp_path, 3)
  (tmp_path / ".git").mkdir()
  (tmp_path / ".git" / "HEAD").write_bytes(b"ref")
  (tmp_path / "__pycache__").mkdir()
  (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"\x00\x01")
  (tmp_path / "empty.txt").write_bytes(b"")
  files = corpus.resolve_files(str(tmp_path))
  assert [f.name for f in files] == ["doc00.txt", "doc01.txt", "doc02.txt"]


@pytest.mark.parametrize("eval_fraction", [1e-12, 1 - 1e-12])
def test_both_splits_get_a_file_even_when_the_hash_puts_all_on_one_side(tmp_path, eval_fraction):
  _write_docs(tmp_path, 2)
  loaded = corpus.load_corpus(str(tmp_path), eval_fraction)
  assert loaded.train_files == 1 and loaded.eval_files == 1
  assert loaded.train.size > 0 and loaded.eval.size > 0


def test_single_file_holds_out_its_tail(tmp_path):
  path = tmp_path / "input.txt"
  path.write_bytes(bytes(range(1, 101)))  # (no NUL: that would make it binary)
  loaded = corpus.load_corpus(str(path), eval_fraction=0.1)
  assert loaded.train.tobytes() == bytes(range(1, 91))
  assert loaded.eval.tobytes() == bytes(range(91, 101))


def test_max_bytes_reads_files_in_sorted_order_up_to_the_cap(tmp_path):
  for name in ["b.txt", "a.txt", "c.txt"]:
    (tmp_path / name).write_bytes(name[0].encode() * 10)
  loaded = corpus.load_corpus(str(tmp_path), 0.5, max_bytes=15)
  streams = loaded.train.tobytes() + loaded.eval.tobytes()
  assert sorted(streams.replace(corpus.SEPARATOR, b"")) == sorted(b"a" * 10 + b"b" * 5)
  assert loaded.train_files + loaded.eval_files == 2


def test_stdlib_corpus_loads_python_sources_deterministically():
  files = corpus.resolve_files(corpus.STDLIB)
  assert files and all(f.suffix == ".py" for f in files)
  assert not any({"site-packages", "dist-packages"} & set(f.parts) for f in files)
  first = corpus.load_corpus(corpus.STDLIB, 0.2, max_bytes=200_000)
  second = corpus.load_corpus(corpus.STDLIB, 0.2, max_bytes=200_000)
  assert first.train.dtype == np.uint8 and first.train.size > 0 and first.eval.size > 0
  assert first.train.size + first.eval.size == 200_000 + first.train_files + first.eval_files - 2
  np.testing.assert_array_equal(first.train, second.train)
  np.testing.assert_array_equal(first.eval, second.eval)


def test_missing_path_names_data_path(tmp_path):
  with pytest.raises(DataError, match=r"data\.path = .*no such file or directory"):
    corpus.load_corpus(str(tmp_path / "nowhere"), 0.1)


def test_glob_matching_nothing_names_data_path_and_pattern(tmp_path):
  with pytest.raises(DataError, match=r"data\.path = .* matched no files; tried the glob pattern"):
    corpus.load_corpus(str(tmp_path / "**" / "*.txt"), 0.1)


def test_only_empty_files_names_data_path(tmp_path):
  (tmp_path / "a.txt").write_bytes(b"")
  (tmp_path / "b.txt").write_bytes(b"")
  with pytest.raises(DataError, match=r"data\.path = .*all 2 matched file\(s\) are empty"):
    corpus.resolve_files(str(tmp_path))


def test_corpus_too_small_for_one_sequence_names_data_path(tmp_path):
  (tmp_path / "a.txt").write_bytes(b"ab")
  with pytest.raises(DataError, match=r"data\.path = .*train split has 1 byte"):
    corpus.load_corpus(str(tmp_path / "a.txt"), 0.1)


@pytest.mark.parametrize("eval_fraction", [0.0, 1.0, float("nan")])
def test_eval_fraction_outside_open_unit_interval_names_the_field(tmp_path, eval_fraction):
  _write_docs(tmp_path, 2)
  with pytest.raises(DataError, match=r"data\.eval_fraction"):
    corpus.load_corpus(str(tmp_path), eval_fraction)


# Shards and iteration.

_TOKENS = np.arange(1000, dtype=np.int32)  # Distinct tokens make any repeat or skip visible.


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_shard_bounds_are_contiguous_disjoint_covering_and_balanced(num_tokens, num_shards):
  bounds = [data.shard_bounds(num_tokens, num_shards, i) for i in range(num_shards)]
  assert bounds[0][0] == 0 and bounds[-1][1] == num_tokens
  assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
  sizes = [end - start for start, end in bounds]
  assert max(sizes) - min(sizes) <= 1


def test_shard_bounds_rejects_an_index_outside_the_shards():
  with pytest.raises(DataError, match=r"shard_index = 3 is invalid"):
    data.shard_bounds(100, 3, 3)


def _first_epoch(it: data.ShardIterator) -> np.ndarray:
  """Window ids of the iterator's first epoch, in serving order."""
  return np.concatenate([it.window_ids(p) for p in range(it.num_windows)])[:it.num_windows]


def test_shards_are_disjoint_and_cover_every_window():
  shards = [data.ShardIterator(_TOKENS, batch_size=3, seq_len=9, num_shards=3, shard_index=i)
            for i in range(3)]
  served = [set(_first_epoch(s).tolist()) for s in shards]
  assert [len(s) for s in served] == [33, 33, 34]
  assert not (served[0] & served[1] or served[1] & served[2] or served[0] & served[2])
  assert set().union(*served) == set(range(100))


def test_every_window_is_served_exactly_once_per_epoch_across_batch_boundaries():
  it = data.ShardIterator(_TOKENS, batch_size=3, seq_len=9, num_shards=2, shard_index=1)
  assert it.num_windows == 50  # 50 is not a multiple of 3, so batch 16 spans two epochs.
  epoch0 = _first_epoch(it)
  epoch1 = np.concatenate([it.window_ids(p) for p in range(34)])[50:100]
  assert sorted(epoch0) == list(range(50, 100)) and sorted(epoch1) == list(range(50, 100))
  assert not np.array_equal(epoch0, epoch1)
  batches = np.stack([next(it) for _ in range(17)])
  np.testing.assert_array_equal(batches.reshape(-1, 10)[:50, 0], epoch0 * 10)
  assert np.all(np.diff(batches, axis=-1) == 1)


def test_batch_is_int32_windows_of_seq_len_plus_one():
  it = data.ShardIterator(_TOKENS, batch_size=4, seq_len=7)
  batch = next(it)
  assert batch.dtype == np.int32 and batch.shape == (4, 8)
  np.testing.assert_array_equal(batch, _TOKENS.reshape(-1, 8)[it.window_ids(0)])
  assert it.position == 1 and it.tokens_per_batch == 28


def test_different_seeds_and_shards_serve_different_batches():
  def first(**kwargs) -> np.ndarray:
    return data.ShardIterator(_TOKENS, batch_size=4, seq_len=9, num_shards=2, **kwargs).batch_at(0)
  assert not np.array_equal(first(shard_index=0, seed=0), first(shard_index=0, seed=1))
  assert not set(first(shard_index=0).ravel()) & set(first(shard_index=1).ravel())
  np.testing.assert_array_equal(first(shard_index=1, seed=5), first(shard_index=1, seed=5))


def test_restore_resumes_iterator_at_the_exact_next_batch_through_json():
  it = data.ShardIterator(_TOKENS, batch_size=4, seq_len=9, seed=3)
  for _ in range(30):
    next(it)
  saved = json.loads(json.dumps(it.state()))
  expected = [next(it) for _ in range(5)]
  resumed = data.ShardIterator(_TOKENS, batch_size=4, seq_len=9, seed=3)
  resumed.restore(saved)
  assert resumed.position == 30
  for batch in expected:
    np.testing.assert_array_equal(next(resumed), batch)


def test_restore_refuses_a_state_from_different_settings():
  state = data.ShardIterator(_TOKENS, batch_size=4, seq_len=9, seed=3).state()
  with pytest.raises(DataError, match=r"'seed' = 3 does not match"):
    data.ShardIterator(_TOKENS, batch_size=4, seq_len=9, seed=4).restore(state)
  with pytest.raises(DataError, match=r"'position' = -1 is invalid"):
    data.ShardIterator(_TOKENS, batch_size=4, seq_len=9).restore({"position": -1})


def test_shard_too_small_for_one_batch_says_what_it_has_and_needs():
  with pytest.raises(DataError, match=r"shard 1 of 4 has 250 tokens .* batch_size \* 10 = 320"):
    data.ShardIterator(_TOKENS, batch_size=32, seq_len=9, num_shards=4, shard_index=1)


# Prefetch.


def _wait_until(condition, timeout_s: float = 5.0) -> None:
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert time.monotonic() < deadline, "condition not reached"
    time.sleep(0.005)


def test_prefetcher_state_is_the_consumers_position_and_resumes_exactly():
  inner = data.ShardIterator(_TOKENS, batch_size=4, seq_len=9, seed=1)
  reference = data.ShardIterator(_TOKENS, batch_size=4, seq_len=9, seed=1)
  with data.Prefetcher(inner, depth=3) as prefetcher:
    for p in range(5):
      np.testing.assert_array_equal(next(prefetcher), reference.batch_at(p))
    _wait_until(lambda: inner.position >= 5 + 3)
    saved = json.loads(json.dumps(prefetcher.state()))
  assert saved["position"] == 5
  fresh = data.ShardIterator(_TOKENS, batch_size=4, seq_len=9, seed=1)
  with data.Prefetcher(fresh) as resumed:
    resumed.restore(saved)
    for p in range(5, 10):
      np.testing.assert_array_equal(next(resumed), reference.batch_at(p))
    resumed.restore({"position": 2})
    np.testing.assert_array_equal(next(resumed), reference.batch_at(2))
    assert resumed.position == 3


def test_prefetcher_applies_transform_in_its_background_thread():
  threads = []

  def transform(batch: np.ndarray) -> np.ndarray:
    threads.append(threading.current_thread())
    return batch + 1

  inner = data.ShardIterator(_TOKENS, batch_size=2, seq_len=9)
  with data.Prefetcher(inner, transform=transform) as prefetcher:
    np.testing.assert_array_equal(next(prefetcher), inner.batch_at(0) + 1)
  assert threads and threading.main_thread() not in threads


def test_prefetcher_reraises_a_producer_error_in_the_consumer():
  calls = []

  def transform(batch: np.ndarray) -> np.ndarray:
    calls.append(1)
    if len(calls) == 2:
      raise ValueError("device put failed")
    return batch

  inner = data.ShardIterator(_TOKENS, batch_size=2, seq_len=9)
  with data.Prefetcher(inner, transform=transform) as prefetcher:
    next(prefetcher)
    for _ in range(2):
      with pytest.raises(ValueError, match="device put failed"):
        next(prefetcher)


def test_prefetcher_close_stops_its_thread_and_rewinds_to_the_consumer():
  inner = data.ShardIterator(_TOKENS, batch_size=2, seq_len=9)
  others = set(threading.enumerate())  # (threads of runs in earlier tests are not this prefetcher's)
  prefetcher = data.Prefetcher(inner)
  mine = [t for t in threading.enumerate() if t.name == "prefetch" and t not in others]
  next(prefetcher)
  _wait_until(lambda: inner.position >= 3)
  prefetcher.close()
  assert len(mine) == 1 and not mine[0].is_alive()
  assert inner.position == 1
  with pytest.raises(RuntimeError, match="closed"):
    next(prefetcher)


# Eval.


def test_eval_batches_are_fixed_evenly_spaced_windows():
  batches = data.eval_batches(_TOKENS, batch_size=2, seq_len=9, num_batches=5)
  assert batches.shape == (5, 2, 10) and batches.dtype == np.int32
  np.testing.assert_array_equal(batches[:, :, 0].ravel(), np.arange(0, 1000, 100))
  np.testing.assert_array_equal(batches, data.eval_batches(_TOKENS, batch_size=2, seq_len=9,
                                                           num_batches=5))


def test_an_eval_split_too_small_gives_every_window_it_has_and_says_so():
  batches = data.eval_batches(_TOKENS, batch_size=10, seq_len=9, num_batches=11)  # 100 windows of the 110 asked
  assert batches.shape == (10, 10, 10)
  np.testing.assert_array_equal(batches[:, :, 0].ravel(), np.arange(0, 1000, 10))  # each window once
  assert "holds 100 windows of 10 tokens, fewer than 11 batches of 10: evaluating on 10 batch(es) of 10" in \
      data.short_of(batches, 11, 10)
  few = data.eval_batches(_TOKENS[:70], batch_size=8, seq_len=9, num_batches=2)  # 7 windows: one batch of them
  assert few.shape == (1, 7, 10) and data.short_of(few, 2, 8)
  assert data.short_of(data.eval_batches(_TOKENS, batch_size=2, seq_len=9, num_batches=5), 5, 2) == ""
  with pytest.raises(DataError, match=r"eval split has 5 tokens: not one window of seq_len \+ 1 = 10"):
    data.eval_batches(_TOKENS[:5], batch_size=2, seq_len=9, num_batches=1)


def test_strided_shards_are_disjoint_cover_every_window_and_each_spans_the_stream():
  tokens = np.arange(10 * 11 * 4, dtype=np.int64) % 256
  shards = [data.ShardIterator(tokens, batch_size=2, seq_len=10, num_shards=4, shard_index=i, layout="strided")
            for i in range(4)]
  seen = [np.concatenate([s.window_ids(p) for p in range(s.num_windows // 2)]) for s in shards]
  everything = np.concatenate(seen)
  assert len(everything) == len(set(everything.tolist())) == 40
  assert all(ids.min() < 8 and ids.max() >= 32 for ids in seen)


def test_binary_files_are_left_out_of_a_text_corpus_with_one_line_and_none_left_is_refused(tmp_path, capsys):
  (tmp_path / "a.py").write_text("print('hello')\n" * 50)
  (tmp_path / "b.txt").write_text("plain text\n" * 50)
  (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 20)
  loaded = corpus.load_corpus(str(tmp_path), 0.5)
  assert b"\x89PNG" not in loaded.train.tobytes() + loaded.eval.tobytes()
  assert loaded.train_files + loaded.eval_files == 2
  assert "1 of 3 files are binary (they hold NUL bytes) and are left out (the first: image.png)" in \
      capsys.readouterr().out
  only = tmp_path / "only"
  only.mkdir()
  (only / "noise.bin").write_bytes(bytes(range(256)) * 4)
  with pytest.raises(DataError, match=r"holds no text: its 1 file\(s\) are binary .*the first: noise.bin"):
    corpus.load_corpus(str(only), 0.5)
