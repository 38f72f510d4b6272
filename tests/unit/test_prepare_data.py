"""launch.prepare_data and the loader that streams its shards: what it writes, what it serves, what it refuses."""

import json
import os
import pathlib
import shutil

import numpy as np
import pytest

from launcher import launch
from runtime.data import corpus, manifest as manifest_lib, prepare, prepared, shards, tokenizers
from runtime.data.service import DataService
from runtime.errors import DataError


def _prepare(input_path, output, **kwargs) -> dict:
  return prepare.prepare(prepare.PrepareConfig(input=str(input_path), output=str(output), progress=False, **kwargs))


def _text_only(text_input: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
  folder = tmp_path / "text"
  shutil.copytree(text_input, folder, ignore=shutil.ignore_patterns("*.jsonl"))
  return folder


# records of 50 tokens: windows of 32 cross records often; the default's hold most documents of the input whole
@pytest.mark.parametrize("record_tokens", [50, prepare.RECORD_TOKENS])
def test_a_byte_dataset_serves_exactly_the_stream_and_batches_of_the_text_read_in_memory(
    text_input, tmp_path, record_tokens):
  folder = _text_only(text_input, tmp_path)
  manifest = _prepare(folder, tmp_path / "bytes", eval_fraction=0.1, shard_bytes=100_000, record_tokens=record_tokens)
  lengths = np.concatenate([np.load(tmp_path / "bytes" / s["index"]) for s in manifest["splits"]["train"]["shards"]])
  records = sum(s["records"] for s in manifest["splits"]["train"]["shards"])
  assert records == int(np.sum(-(-lengths // record_tokens))) > len(lengths)
  memory, disk = corpus.load_corpus(str(folder), 0.1), corpus.load_corpus(str(tmp_path / "bytes"), 0.5)
  assert isinstance(disk.train, prepared.TokenSplit) and len(list(tmp_path.glob("bytes/train-*.array_record"))) > 2
  np.testing.assert_array_equal(disk.train.read(0, len(disk.train)), memory.train)
  np.testing.assert_array_equal(disk.eval.read(0, len(disk.eval)), memory.eval)
  assert (disk.train_files, disk.eval_files) == (memory.train_files, memory.eval_files)
  for layout in shards.SHARD_LAYOUTS:
    a, b = (shards.ShardIterator(c.train, batch_size=4, seq_len=31, num_shards=3, shard_index=2, seed=5,
                                 layout=layout) for c in (memory, disk))
    for position in range(0, 3000, 37):  # across epochs
      np.testing.assert_array_equal(a.batch_at(position), b.batch_at(position))
  a, b = (DataService(c.train, seq_len=31, seed=5) for c in (memory, disk))
  serials = np.arange(0, 60_000, 997)
  np.testing.assert_array_equal(a.windows(serials), b.windows(serials))
  np.testing.assert_array_equal(
      shards.eval_batches(memory.eval, batch_size=3, seq_len=31, num_batches=4),
      shards.eval_batches(disk.eval, batch_size=3, seq_len=31, num_batches=4))


def test_sentencepiece_on_text_and_jsonl_writes_shards_a_manifest_and_a_tokenizer_that_round_trips(
    prepared_dataset, text_input):
  manifest = manifest_lib.read(prepared_dataset)
  assert manifest["tokenizer"] == dict(kind="sentencepiece", vocab_size=512, eod_id=1, file="tokenizer.model")
  assert manifest["dtype"] == "uint16" and manifest["input"]["shards"] >= 3
  train, held_out = manifest["splits"]["train"], manifest["splits"]["eval"]
  assert train["documents"] + held_out["documents"] == 30 + 12 and held_out["documents"] >= 1
  assert all(shard["tokens"] > 0 for shard in manifest_lib.shards(manifest))
  assert not list(prepared_dataset.glob(".*tmp*")), "a temporary file was left"
  tokenizer = tokenizers.load("sentencepiece", prepared_dataset)
  split, _, _ = prepared.load(str(prepared_dataset))
  stream = split.read(0, len(split))
  assert stream.max() < 512 and (stream == tokenizer.eod_id).sum() == train["documents"] - 1
  first_doc = stream[:np.argmax(stream == tokenizer.eod_id)]
  texts = [p.read_text() for p in text_input.rglob("*.py")] + [
      json.loads(line)["text"] for line in (text_input / "docs.jsonl").read_text().splitlines()]
  assert tokenizer.decode(first_doc) in texts  # tokens decode to one of the documents, exactly
  assert len(stream) < 0.8 * sum(len(t) for t in texts)  # and fewer tokens than bytes


def test_an_existing_tokenizer_file_is_used_as_given(prepared_dataset, text_input, tmp_path):
  given = prepared_dataset / "tokenizer.model"
  manifest = _prepare(text_input, tmp_path / "given", tokenizer=str(given))
  assert manifest["tokenizer"]["kind"] == "sentencepiece" and manifest["tokenizer"]["vocab_size"] == 512
  assert (tmp_path / "given" / "tokenizer.model").read_bytes() == given.read_bytes()
  with pytest.raises(DataError, match="--vocab_size = 1000 does not match .* whose vocabulary is 512"):
    _prepare(text_input, tmp_path / "other", tokenizer=str(given), vocab_size=1000)


def test_a_hugging_face_tokenizer_json_is_used_as_given(text_input, tmp_path):
  hf = pytest.importorskip("tokenizers")
  tok = hf.Tokenizer(hf.models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = hf.decoders.ByteLevel()
  tok.train_from_iterator([p.read_text() for p in text_input.rglob("*.py")], hf.trainers.BpeTrainer(
      vocab_size=400, special_tokens=["<unk>", "</s>"], initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False))
  tok.save(str(tmp_path / "tokenizer.json"))
  manifest = _prepare(text_input, tmp_path / "hf", tokenizer=str(tmp_path / "tokenizer.json"))
  assert manifest["tokenizer"]["kind"] == "huggingface" and manifest["tokenizer"]["eod_id"] == tok.token_to_id("</s>")
  loaded = tokenizers.load("huggingface", tmp_path / "hf")
  text = (text_input / "sub").glob("*.py").__next__().read_text()
  assert loaded.decode(loaded.encode([text.encode()])[0]) == text


def test_an_interrupted_preparation_finishes_and_keeps_its_complete_shards(text_input, tmp_path):
  out = tmp_path / "resumed"
  whole = _prepare(text_input, out, shard_bytes=150_000)
  manifest_path = out / manifest_lib.NAME
  manifest_path.unlink()  # as if stopped before its last shard was written
  last = whole["splits"]["train"]["shards"][-1]["file"]  # e.g. train-00004-of-00005.array_record
  os.remove(out / last)
  kept = {p.name: p.stat().st_mtime_ns for p in out.glob("*.array_record") if p.name[-23:] != last[-23:]}
  again = _prepare(text_input, out, shard_bytes=150_000)
  assert again["splits"] == whole["splits"]
  assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.array_record") if p.name in kept} == kept
  with pytest.raises(DataError, match=r"other settings \(shard_bytes was 150000, now 200000\)"):
    _prepare(text_input, out, shard_bytes=200_000)


def test_workers_write_the_same_shards_as_one_process(text_input, tmp_path):
  one = _prepare(text_input, tmp_path / "one", shard_bytes=200_000)
  two = _prepare(text_input, tmp_path / "two", shard_bytes=200_000, workers=2)
  assert one["splits"] == two["splits"]


def test_a_single_document_gives_its_tail_to_evaluation_and_a_small_input_holds_one_document_out(tmp_path):
  (tmp_path / "one").mkdir()
  (tmp_path / "one" / "only.txt").write_text("the only document. " * 500)
  manifest = _prepare(tmp_path / "one", tmp_path / "out1", eval_fraction=0.1, record_tokens=3)
  assert [manifest["splits"][s]["tokens"] for s in ("train", "eval")] == [8550, 950]
  assert [manifest["splits"][s]["shards"][0]["records"] for s in ("train", "eval")] == [2850, 317]
  memory, disk = corpus.load_corpus(str(tmp_path / "one"), 0.1), corpus.load_corpus(str(tmp_path / "out1"), 0.1)
  np.testing.assert_array_equal(disk.train.read(0, len(disk.train)), memory.train)
  np.testing.assert_array_equal(disk.eval.read(0, len(disk.eval)), memory.eval)
  (tmp_path / "few").mkdir()
  for i in range(5):
    (tmp_path / "few" / f"{i}.txt").write_text(f"document {i} " * 50)
  manifest = _prepare(tmp_path / "few", tmp_path / "out5", eval_fraction=0.001)
  assert [manifest["splits"][s]["documents"] for s in ("train", "eval")] == [4, 1]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_shard_is_refused_by_name(prepared_dataset, tmp_path, damage):
  copy = tmp_path / "copy"
  shutil.copytree(prepared_dataset, copy)
  victim = sorted(copy.glob("train-*.array_record"))[1]
  data = bytearray(victim.read_bytes())
  if damage == "flip":
    data[len(data) // 2] ^= 0x40
  else:
    data = data[: len(data) // 2]
  victim.write_bytes(bytes(data))
  with pytest.raises(DataError, match=f"shard {victim.name} (does not match its checksum|has {len(data)} bytes)"):
    corpus.load_corpus(str(copy), 0.02)


def test_a_window_reads_only_the_records_it_overlaps_and_a_dataset_of_a_record_per_document_still_reads(
    tmp_path, monkeypatch):
  """A window of a long document reads at most its width plus a record's tokens, not the document; a dataset of
  format version 1 (a whole document per record) still serves the same stream."""
  from grain.sources import ArrayRecordDataSource  # pylint: disable=import-outside-toplevel
  (tmp_path / "in").mkdir()
  rng = np.random.default_rng(0)
  for i in range(3):
    (tmp_path / "in" / f"{i}.txt").write_bytes(bytes(rng.integers(97, 123, 60_000 + 7_000 * i, np.uint8)))
  _prepare(tmp_path / "in", tmp_path / "v2", record_tokens=1000, eval_fraction=0.3)
  _prepare(tmp_path / "in", tmp_path / "v1", record_tokens=10**9, eval_fraction=0.3)
  manifest = json.loads((tmp_path / "v1" / manifest_lib.NAME).read_text())
  del manifest["record_tokens"]
  for shard in manifest_lib.shards(manifest):
    del shard["records"]
  (tmp_path / "v1" / manifest_lib.NAME).write_text(json.dumps(dict(manifest, format_version=1)))
  read_sizes = []
  getitem = ArrayRecordDataSource.__getitem__
  monkeypatch.setattr(ArrayRecordDataSource, "__getitem__",
                      lambda self, key: read_sizes.append(len(record := getitem(self, key))) or record)
  v1, v2 = (corpus.load_corpus(str(tmp_path / v), 0.5) for v in ("v1", "v2"))
  for window in range(0, len(v2.train) // 129, 97):
    read_sizes.clear()
    one = v1.train.windows(128)[[window]]
    assert sum(read_sizes) >= 60_000  # a document per record: the window reads its whole document
    read_sizes.clear()
    np.testing.assert_array_equal(v2.train.windows(128)[[window]], one)
    assert len(read_sizes) <= 2 and max(read_sizes) <= 1000  # the one or two records of 1,000 tokens it overlaps


def test_a_manifest_whose_records_do_not_add_up_is_refused_naming_the_field(prepared_dataset, tmp_path):
  copy = tmp_path / "copy"
  shutil.copytree(prepared_dataset, copy)
  manifest = json.loads((copy / manifest_lib.NAME).read_text())
  first, second = manifest["splits"]["train"]["shards"][:2]
  first["records"], second["records"] = first["records"] + 1, second["records"] - 1  # the total still adds up
  (copy / manifest_lib.NAME).write_text(json.dumps(manifest))
  with pytest.raises(DataError, match=f"shard {first['file']}'s field 'records' = {first['records']} does not match "
                     f"its documents' lengths, which make {first['records'] - 1} records of 4096 tokens"):
    corpus.load_corpus(str(copy), 0.02)
  (copy / manifest_lib.NAME).write_text(json.dumps(dict(manifest, record_tokens=0)))
  with pytest.raises(DataError, match="field 'record_tokens' = 0 is invalid: allowed an integer >= 1"):
    corpus.load_corpus(str(copy), 0.02)
  del manifest["splits"]["eval"]["shards"][0]["records"]
  (copy / manifest_lib.NAME).write_text(json.dumps(manifest))
  with pytest.raises(DataError, match=r"field 'splits.eval.shards\[\].records' = None is invalid: allowed int"):
    corpus.load_corpus(str(copy), 0.02)


def test_a_manifest_that_does_not_parse_or_is_of_another_version_is_refused(prepared_dataset, tmp_path):
  copy = tmp_path / "copy"
  shutil.copytree(prepared_dataset, copy)
  manifest = json.loads((copy / manifest_lib.NAME).read_text())
  for version in (99, 2.0):
    (copy / manifest_lib.NAME).write_text(json.dumps(dict(manifest, format_version=version)))
    with pytest.raises(DataError, match=f"format_version {version} is not one this version reads \\(allowed 1 or 2\\)"):
      manifest_lib.vocab_size(str(copy))
  (copy / manifest_lib.NAME).write_text("{not json")
  with pytest.raises(DataError, match="does not parse as JSON"):
    manifest_lib.vocab_size(str(copy))


def test_bad_jsonl_lines_stop_the_preparation_naming_file_and_line_unless_skipped(tmp_path):
  (tmp_path / "in").mkdir()
  lines = [json.dumps({"text": f"document {i} " * 30}) for i in range(8)]
  lines[5] = json.dumps({"body": "no text field"})
  lines[6] = "{broken"
  (tmp_path / "in" / "a.jsonl").write_text("\n".join(lines) + "\n")
  with pytest.raises(DataError, match=r"a.jsonl:6: no field 'text' \(its fields: \['body'\]\)"):
    _prepare(tmp_path / "in", tmp_path / "out")
  manifest = _prepare(tmp_path / "in", tmp_path / "skipped", skip_bad_lines=True, shard_bytes=40)
  assert manifest["input"]["bad_lines_dropped"] == 2 and manifest["input"]["first_bad_line"].endswith("a.jsonl:6")
  assert sum(manifest["splits"][s]["documents"] for s in ("train", "eval")) == 6


# (arguments, what the one line must name); the input folder is FOLDER, an empty one EMPTY, a junk file JUNK.
BAD = [
    (["--input=/no/such/input"], "--input = '/no/such/input': no such file or directory"),
    (["--input=EMPTY"], "all 1 matched file(s) are empty"),
    (["--input=FOLDER", "--tokenizer=wordpiece"], "--tokenizer = 'wordpiece' is invalid"),
    (["--input=FOLDER", "--tokenizer=JUNK"], "is not a SentencePiece model it can read"),
    (["--input=FOLDER", "--tokenizer=sentencepiece", "--vocab_size=100"], "--vocab_size = 100 is too small"),
    (["--input=FOLDER", "--tokenizer=sentencepiece", "--vocab_size=270"], "--vocab_size = 270: SentencePiece cannot"),
    (["--input=FOLDER", "--tokenizer=byte", "--vocab_size=512"], "--vocab_size = 512 with --tokenizer=byte"),
    (["--input=BADJSONL"], "bad.jsonl:2: not a JSON object"),
    (["--input=FOLDER", "--eval_fraction=1.5"], "--eval_fraction = 1.5 is invalid"),
    (["--input=FOLDER", "--record_tokens=0"], "--record_tokens = 0 is invalid: allowed an integer >= 1"),
]


@pytest.mark.parametrize("args,named", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(text_input, tmp_path, args, named):
  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "nothing.txt").write_text("")
  (tmp_path / "junk.model").write_bytes(b"\x00 not a model")
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "bad.jsonl").write_text('{"text": "fine"}\n[1, 2]\n')
  swap = {"FOLDER": str(text_input), "EMPTY": str(tmp_path / "empty"), "JUNK": str(tmp_path / "junk.model"),
          "BADJSONL": str(tmp_path / "bad")}
  args = [a.split("=")[0] + "=" + swap.get(a.split("=", 1)[1], a.split("=", 1)[1]) for a in args]
  out = launch("prepare_data", *args, f"--output={tmp_path / 'out'}", "--progress=false", cwd=tmp_path)
  assert out.returncode == 2, out.stderr[-2000:]
  assert "Traceback" not in out.stderr and named in out.stderr, out.stderr[-2000:]
  assert len([line for line in out.stderr.splitlines() if line.startswith("error:")]) == 1
