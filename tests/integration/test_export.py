"""The built-in models exported to Hugging Face's format (Llama, Qwen3, GPT-NeoX, GPT-2): names, shapes, dtypes and
values read back, the config and the byte tokenizer; and (with the `transformers` extra installed) transformers'
logits equal the JAX model's and its greedy text equals launch.sample's at temperature 0."""

import json

import jax
import numpy as np
import pytest

from models import lm
from models.config import ModelConfig
from runtime.data import tokenizers
from runtime.errors import DataError
from runtime.experiments import modes
from runtime.trained import evaluation, export, sampling, saved
from tests import launcher

TEXT = ["def main():\n    return 42\n" * 2, "import os\nimport sys\nclass Café:\n  pass\n" * 2]


def _saved(tiny_config, tmp_path, **model):
  tiny_config.model.kind = model.pop("kind", "llama")
  for key, value in model.items():
    setattr(tiny_config.model, key, value)
  run = modes.prepare(tiny_config)
  params = jax.device_get(lm.init_params(run.model, jax.random.key(7)))
  return saved.save(tmp_path / "run" / "model", run, params, run_name="run", tokens=0, eval_loss=float("nan")), run


@pytest.mark.parametrize("tied", [True, False])
def test_the_safetensors_hold_every_parameter_under_llamas_names_and_layouts(tiny_config, tmp_path, tied):
  model_dir, run = _saved(tiny_config, tmp_path, tied_embeddings=tied)
  out = export.export(model_dir, tmp_path / "hf")
  tensors = export.read_safetensors(tmp_path / "hf")
  cfg, params = run.model, saved.load_model(model_dir).params
  d, f, k = cfg.d_model, cfg.mlp_dim, cfg.d_model // cfg.num_heads
  expected = {"model.embed_tokens.weight": (cfg.vocab_size, d), "model.norm.weight": (d,)}
  if not tied:
    expected["lm_head.weight"] = (cfg.vocab_size, d)
  for i in range(cfg.num_layers):
    p = f"model.layers.{i}."
    expected.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                     p + "self_attn.q_proj.weight": (cfg.num_heads * k, d),
                     p + "self_attn.k_proj.weight": (cfg.kv_heads() * k, d),
                     p + "self_attn.v_proj.weight": (cfg.kv_heads() * k, d),
                     p + "self_attn.o_proj.weight": (d, cfg.num_heads * k), p + "mlp.gate_proj.weight": (f, d),
                     p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f)})
  assert {n: t.shape for n, t in tensors.items()} == expected
  assert {t.dtype for t in tensors.values()} == {np.dtype(np.float32)}
  assert out["params"] == cfg.num_params() == sum(t.size for t in tensors.values())
  query = params["block_1"]["attn"]["query"]["kernel"]  # [d, heads, head_dim]: row h·K + j of q_proj is head h's j
  np.testing.assert_array_equal(tensors["model.layers.1.self_attn.q_proj.weight"][2 * k + 3], query[:, 2, 3])
  np.testing.assert_array_equal(tensors["model.layers.0.mlp.down_proj.weight"], params["block_0"]["down"]["kernel"].T)
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] == tied
  assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (
      cfg.num_heads, cfg.kv_heads(), k)


def test_a_large_model_is_sharded_with_an_index_and_reads_back_the_same(tiny_config, tmp_path):
  model_dir, _ = _saved(tiny_config, tmp_path)
  whole, sharded = (export.export(model_dir, tmp_path / name, shard_bytes=b)
                    for name, b in (("a", 2**30), ("b", 50_000)))
  assert whole["files"][0] == "model.safetensors" and export.INDEX in sharded["files"]
  index = json.loads((tmp_path / "b" / export.INDEX).read_text())
  assert len(set(index["weight_map"].values())) > 2
  a, b = export.read_safetensors(tmp_path / "a"), export.read_safetensors(tmp_path / "b")
  assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)


def test_the_byte_tokenizer_exports_as_one_token_per_byte():
  tokenizers = pytest.importorskip("tokenizers")
  tokenizer = tokenizers.Tokenizer.from_str(json.dumps(export.byte_tokenizer_json()))
  for text in TEXT:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_a_gpt_model_is_gpt_neox_with_rotary_positions_and_gpt2_with_learned_ones(tiny_config, tmp_path):
  for positions, arch in (("rotary", "GPTNeoXForCausalLM"), ("learned", "GPT2LMHeadModel")):
    model_dir, run = _saved(tiny_config, tmp_path / positions, kind="gpt", positions=positions)
    export.export(model_dir, tmp_path / positions / "hf")
    tensors = export.read_safetensors(tmp_path / positions / "hf")
    config = json.loads((tmp_path / positions / "hf" / "config.json").read_text())
    assert config["architectures"] == [arch] and config["tie_word_embeddings"] is True
    cfg, params = run.model, saved.load_model(model_dir).params
    d, k = cfg.d_model, cfg.d_model // cfg.num_heads
    attn = params["block_1"]["attn"]
    # Our GPT has no attention biases: the architectures' are written as zeros, and only they are added.
    biases = [t for n, t in tensors.items() if n.endswith(("query_key_value.bias", "attention.dense.bias",
                                                             "c_attn.bias", "attn.c_proj.bias"))]
    assert len(biases) == 2 * cfg.num_layers and not any(b.any() for b in biases)
    assert sum(t.size for t in tensors.values()) == cfg.num_params() + sum(b.size for b in biases)
    if arch == "GPTNeoXForCausalLM":  # one fused projection, head by head: [heads, (q, k, v), head_dim] rows
      qkv = tensors["gpt_neox.layers.1.attention.query_key_value.weight"]
      assert qkv.shape == (3 * d, d)
      np.testing.assert_array_equal(qkv[2 * 3 * k + 3], attn["query"]["kernel"][:, 2, 3])
      np.testing.assert_array_equal(qkv[2 * 3 * k + k + 3], attn["key"]["kernel"][:, 2, 3])
      np.testing.assert_array_equal(qkv[2 * 3 * k + 2 * k + 3], attn["value"]["kernel"][:, 2, 3])
      assert config["use_parallel_residual"] is False and config["rope_parameters"]["partial_rotary_factor"] == 1.0
    else:  # Conv1D [in, out]: query | key | value columns, each head-major
      c_attn = tensors["transformer.h.1.attn.c_attn.weight"]
      assert c_attn.shape == (d, 3 * d)
      np.testing.assert_array_equal(c_attn[:, d + 2 * k + 3], attn["key"]["kernel"][:, 2, 3])
      np.testing.assert_array_equal(tensors["transformer.wpe.weight"], params["pos_embed"])
      np.testing.assert_array_equal(tensors["transformer.h.0.mlp.c_fc.weight"], params["block_0"]["mlp_in"]["kernel"])


def test_a_llama_model_with_qk_norm_is_qwen3_with_each_layers_query_and_key_norms(tiny_config, tmp_path):
  model_dir, run = _saved(tiny_config, tmp_path, qk_norm=True)
  export.export(model_dir, tmp_path / "hf")
  tensors = export.read_safetensors(tmp_path / "hf")
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
  head = run.model.d_model // run.model.num_heads
  norms = {n: t.shape for n, t in tensors.items() if n.endswith(("q_norm.weight", "k_norm.weight"))}
  assert norms == {f"model.layers.{i}.self_attn.{q}_norm.weight": (head,) for i in range(run.model.num_layers)
                   for q in "qk"}
  assert sum(t.size for t in tensors.values()) == run.model.num_params()


def test_a_gpt_model_with_qk_norm_has_no_exact_architecture_and_is_refused_in_one_line(tiny_config, tmp_path):
  model_dir, _ = _saved(tiny_config, tmp_path, kind="gpt", qk_norm=True)
  with pytest.raises(DataError, match="'gpt' model with QK-norm .* matches no transformers architecture exactly"):
    export.export(model_dir, tmp_path / "hf")
  assert not (tmp_path / "hf").exists()


# Text a tokenizer may mishandle: digits, whitespace runs, scripts and bytes the corpus lacks, its own piece names.
ODD = ["12345 67.890 1e-9 0x1F", "a  b   c    d\t\t\te\n\n\n  \n", "   leading", "trailing   ", "\r\n\r\n", " ", "",
       "日本語のテキスト", "Ελληνικά и кириллица", "emoji 🙂👍🏽", "\x00\x01\x7f control", "nbsp\u00a0em\u2003",
       "\u2581already\u2581escaped", "</s> and <unk> as text", "ǅ Å ﬁ"]


def _corpus(folder):
  return [p.read_text(encoding="utf-8") for p in sorted(folder.rglob("*.py"))]


def test_a_sentencepiece_tokenizer_exports_as_a_tokenizer_json_that_gives_its_ids(prepared_dataset, text_input):
  hf_tokenizers = pytest.importorskip("tokenizers")
  ours, _ = tokenizers.of_data(str(prepared_dataset))
  spec, eos = export.sentencepiece_tokenizer_json(ours.serialized())
  theirs = hf_tokenizers.Tokenizer.from_str(json.dumps(spec))
  texts = _corpus(text_input) + ODD
  assert len(texts) > 40 and eos == "</s>"
  for text in texts:
    ids = ours.encode([text.encode("utf-8")])[0].tolist()
    assert theirs.encode(text, add_special_tokens=False).ids == ids, text[:60]
    assert theirs.decode(ids) == ours.decode(ids)


def test_a_sentencepiece_model_exported_inexactly_is_refused_naming_the_setting(text_input):
  unigram = tokenizers.train_sentencepiece([t.encode() for t in _corpus(text_input)], 400, "unigram")
  with pytest.raises(DataError, match="model_type = 'UNIGRAM'; only a model with model_type = 'BPE'"):
    export.sentencepiece_tokenizer_json(unigram.serialized())


def test_a_users_model_is_refused_naming_the_built_in_models():
  why = export.refusal(ModelConfig(kind="my_models.pair:spec"))
  assert "'my_models.pair:spec' is a user's model" in why and "'gpt' and 'llama'" in why


def test_the_command_writes_the_files_and_refuses_a_directory_in_use(tiny_config, tmp_path):
  model_dir, _ = _saved(tiny_config, tmp_path)
  out = launcher.launch("export", f"--model={model_dir}", f"--output={tmp_path / 'hf'}", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "model.safetensors, tokenizer.json" in out.stdout
  again = launcher.launch("export", f"--model={model_dir}", f"--output={tmp_path / 'hf'}", cwd=tmp_path)
  assert again.returncode != 0 and "exists and is not an empty directory" in again.stderr


@pytest.mark.slow  # needs torch and transformers: pip install -e '.[transformers]'
@pytest.mark.parametrize("model", [dict(kind="llama", num_kv_heads=2, tied_embeddings=False),
                                   dict(kind="llama", qk_norm=True), dict(kind="gpt"),
                                   dict(kind="gpt", positions="learned")], ids=["llama", "qwen3", "gpt_neox", "gpt2"])
def test_transformers_loads_the_export_and_its_logits_and_greedy_text_equal_the_jax_models(tiny_config, tmp_path,
                                                                                          model):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  for key, value in model.items():
    setattr(tiny_config.model, key, value)
  run = modes.prepare(tiny_config)
  modes.train(tiny_config, tmp_path)  # trained weights: logits far from uniform
  model_dir = tmp_path / "decoupled" / saved.MODEL_DIR
  export.export(model_dir, tmp_path / "hf")
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  ids = np.asarray([tokenizer(t).input_ids[:run.model.max_len] for t in TEXT])
  assert ids.tolist() == [list(t.encode("utf-8"))[:run.model.max_len] for t in TEXT]
  with torch.no_grad():
    theirs = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
  loaded = saved.load_model(model_dir)
  ours = np.asarray(lm.logits(loaded.params, run.model, ids))
  difference = float(np.abs(theirs - ours).max())
  print(f"{type(hf).__name__}: transformers vs JAX logits: max |difference| {difference:.2e} "
        f"(largest logit {np.abs(ours).max():.2f})")
  assert difference < 1e-4
  prompt, new = "def ", 16
  greedy = sampling.generate(run.model, loaded.params, loaded.tokenizer, prompt, tokens=new, temperature=0.0,
                             stop_at_end=False)
  with torch.no_grad():
    out = hf.generate(torch.tensor([list(prompt.encode())]), max_new_tokens=new, do_sample=False,
                      pad_token_id=tokenizer.eos_token_id, eos_token_id=None)
  assert out[0, len(prompt):].tolist() == greedy["ids"]


@pytest.mark.slow  # needs torch and transformers: pip install -e '.[transformers]'
def test_a_llama_trained_on_a_sentencepiece_dataset_exports_with_its_tokenizers_ids(tiny_config, prepared_dataset,
                                                                                      text_input, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  tiny_config.model.kind, tiny_config.data.path = "llama", str(prepared_dataset)
  run = modes.prepare(tiny_config)
  modes.train(tiny_config, tmp_path)
  model_dir = tmp_path / "decoupled" / saved.MODEL_DIR
  export.export(model_dir, tmp_path / "hf")
  loaded = saved.load_model(model_dir)
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  for text in _corpus(text_input) + ODD:
    assert tokenizer(text).input_ids == loaded.tokenizer.encode([text.encode("utf-8")])[0].tolist(), text[:60]
  assert tokenizer.eos_token_id == loaded.tokenizer.eod_id
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
  ids = np.asarray([tokenizer(t).input_ids[:run.model.max_len] for t in _corpus(text_input)[:2]])
  with torch.no_grad():
    theirs = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
  ours = np.asarray(lm.logits(loaded.params, run.model, ids))
  print(f"SentencePiece Llama: transformers vs JAX logits: max |difference| {float(np.abs(theirs - ours).max()):.2e}")
  assert float(np.abs(theirs - ours).max()) < 1e-4
  greedy = sampling.generate(run.model, loaded.params, loaded.tokenizer, "def ", tokens=16, temperature=0.0,
                             stop_at_end=False)
  prompt = tokenizer("def ").input_ids
  with torch.no_grad():
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.eos_token_id,
                      eos_token_id=None)
  assert out[0, len(prompt):].tolist() == greedy["ids"]


# A local lm-evaluation-harness task: the rolling log-likelihood of every document of a JSONL file (no downloads).
HELD_OUT_TASK = """task: held_out_text
dataset_path: json
dataset_kwargs:
  data_files:
    test: {jsonl}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


@pytest.mark.slow  # needs lm-evaluation-harness (pip install lm-eval accelerate) and transformers
def test_lm_evaluation_harness_scores_the_export_as_launch_evaluate_does(tiny_config, text_input, tmp_path,
                                                                         monkeypatch):
  lm_eval = pytest.importorskip("lm_eval")
  pytest.importorskip("transformers")
  pytest.importorskip("accelerate")
  from lm_eval import tasks  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  modes.train(tiny_config, tmp_path)
  model_dir = tmp_path / "decoupled" / saved.MODEL_DIR
  export.export(model_dir, tmp_path / "hf")
  files = sorted(text_input.glob("*.py"))
  (tmp_path / "held_out.jsonl").write_text("".join(json.dumps({"text": f.read_text()}) + "\n" for f in files))
  (tmp_path / "task").mkdir()
  (tmp_path / "task" / "held_out_text.yaml").write_text(HELD_OUT_TASK.format(jsonl=tmp_path / "held_out.jsonl"))
  results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={tmp_path / 'hf'},dtype=float32",
                                    tasks=["held_out_text"], task_manager=tasks.TaskManager(
                                        include_path=str(tmp_path / "task")), device="cpu", batch_size=8)
  theirs = results["results"]["held_out_text"]["bits_per_byte,none"]
  ours = evaluation.evaluate(saved.load_model(model_dir), str(text_input / "*.py"), split="all",
                             progress=False)["bits_per_byte"]
  print(f"bits per byte: lm-evaluation-harness {theirs:.4f}, launch.evaluate {ours:.4f}")
  assert abs(theirs - ours) / ours < 0.01
