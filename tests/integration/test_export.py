"""A Llama model exported to Hugging Face's format: names, shapes, dtypes and values read back, the config and the
byte tokenizer; and (with the `transformers` extra installed) transformers' logits equal the JAX model's."""

import json

import jax
import numpy as np
import pytest

from models import lm
from runtime.errors import DataError
from runtime.experiments import modes
from runtime.trained import export, saved
from tests import launcher

TEXT = ["def main():\n    return 42\n" * 2, "import os\nimport sys\nclass Café:\n  pass\n" * 2]


def _saved(tiny_config, tmp_path, **model):
  tiny_config.model.kind = "llama"
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


@pytest.mark.parametrize("model, says", [
    (dict(kind="gpt"), "model.kind is 'gpt': export writes transformers' LlamaForCausalLM"),
    (dict(qk_norm=True), "QK-norm"),
])
def test_a_model_without_a_llama_layout_is_refused_in_one_line(tiny_config, tmp_path, model, says):
  model_dir, _ = _saved(tiny_config, tmp_path, **model)
  with pytest.raises(DataError, match=says):
    export.export(model_dir, tmp_path / "hf")
  assert not (tmp_path / "hf").exists()


def test_the_command_writes_the_files_and_refuses_a_directory_in_use(tiny_config, tmp_path):
  model_dir, _ = _saved(tiny_config, tmp_path)
  out = launcher.launch("export", f"--model={model_dir}", f"--output={tmp_path / 'hf'}", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "model.safetensors, tokenizer.json" in out.stdout
  again = launcher.launch("export", f"--model={model_dir}", f"--output={tmp_path / 'hf'}", cwd=tmp_path)
  assert again.returncode != 0 and "exists and is not an empty directory" in again.stderr


@pytest.mark.slow  # needs torch and transformers: pip install -e '.[transformers]'
def test_transformers_loads_the_export_and_its_logits_equal_the_jax_models(tiny_config, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  tiny_config.model.kind, tiny_config.model.num_kv_heads, tiny_config.model.tied_embeddings = "llama", 2, False
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
  ours = np.asarray(lm.logits(saved.load_model(model_dir).params, run.model, ids))
  difference = float(np.abs(theirs - ours).max())
  print(f"transformers vs JAX logits: max |difference| {difference:.2e} (largest logit {np.abs(ours).max():.2f})")
  assert difference < 1e-4
