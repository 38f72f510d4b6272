"""The LM: causality, shapes, and parameter shardings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from models import lm
from models.transformer import ModelConfig, TransformerLM


@pytest.mark.parametrize("positions", ["rotary", "learned"])
def test_output_at_a_position_has_exactly_zero_gradient_wrt_later_inputs(positions):
  cfg = ModelConfig(num_layers=2, d_model=32, num_heads=4, mlp_dim=64, max_len=16, positions=positions)
  model = TransformerLM(cfg)
  tokens_1xL = jnp.asarray(np.random.default_rng(0).integers(0, 256, (1, 16)), jnp.int32)
  variables = model.init(jax.random.key(0), tokens_1xL)
  perturbations = variables["perturbations"]
  i = 7

  def logits_at_i(perturb):
    return model.apply({"params": variables["params"], "perturbations": perturb}, tokens_1xL)[0, i].sum()

  grad_1xLxD = jax.grad(logits_at_i)(perturbations)["embedded"]
  later = np.abs(np.asarray(grad_1xLxD[0, i + 1:]))
  earlier = np.abs(np.asarray(grad_1xLxD[0, :i + 1]))
  assert later.max() == 0.0
  assert (earlier.sum(axis=-1) > 0).all()


def test_loss_of_untrained_model_is_near_uniform_over_bytes():
  # Unit-variance logits add about 0.5 nats to ln(256).
  cfg = ModelConfig(num_layers=1, d_model=32, num_heads=2, mlp_dim=64, max_len=16)
  params = lm.init_params(cfg, jax.random.key(1))
  batch = jnp.asarray(np.random.default_rng(1).integers(0, 256, (4, 17)), jnp.int32)
  assert np.log(256) < float(lm.loss_fn(params, cfg, batch)) < np.log(256) + 1.0


def test_fsdp_specs_split_each_large_tensor_along_a_divisible_axis():
  cfg = ModelConfig(num_layers=1, d_model=64, num_heads=4, mlp_dim=256, max_len=16)
  mesh = Mesh(np.asarray(jax.devices()[:4]), ("data",))
  shardings = lm.param_shardings(cfg, mesh, fsdp=True)
  params = jax.jit(lm.init_params, static_argnums=0, out_shardings=shardings)(cfg, jax.random.key(0))
  mlp_in = params["block_0"]["mlp_in"]["kernel"]
  assert "data" in mlp_in.sharding.spec
  assert len(mlp_in.addressable_shards) == 4
  assert mlp_in.addressable_shards[0].data.size == mlp_in.size // 4
  replicated = jax.jit(lm.init_params, static_argnums=0,
                       out_shardings=lm.param_shardings(cfg, mesh, fsdp=False))(cfg, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(mlp_in), np.asarray(replicated["block_0"]["mlp_in"]["kernel"]))


def test_qk_norm_makes_the_logits_independent_of_the_scale_of_queries_and_keys():
  cfg = ModelConfig(num_layers=1, d_model=32, num_heads=2, mlp_dim=64, max_len=16, qk_norm=True)
  params = lm.init_params(cfg, jax.random.key(0))
  attention = params["block_0"]["attn"]
  assert attention["query_norm"]["scale"].shape == attention["key_norm"]["scale"].shape == (16,)  # head size
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.int32)
  plain = {k: v for k, v in attention.items() if not k.endswith("_norm")}
  without = lm.init_params(ModelConfig(num_layers=1, d_model=32, num_heads=2, mlp_dim=64, max_len=16),
                           jax.random.key(0))
  without["block_0"]["attn"] = plain
  # Queries scaled up 100x: the normed model's logits do not move, the plain model's do.
  scaled = lambda p: {**p, "block_0": {**p["block_0"], "attn": {**p["block_0"]["attn"], "query": {
      "kernel": 100 * p["block_0"]["attn"]["query"]["kernel"]}}}}
  normed = ModelConfig(num_layers=1, d_model=32, num_heads=2, mlp_dim=64, max_len=16, qk_norm=True)
  np.testing.assert_allclose(TransformerLM(normed).apply({"params": scaled(params)}, tokens),
                             TransformerLM(normed).apply({"params": params}, tokens), rtol=1e-4, atol=1e-4)
  unnormed = ModelConfig(num_layers=1, d_model=32, num_heads=2, mlp_dim=64, max_len=16)
  assert not np.allclose(TransformerLM(unnormed).apply({"params": scaled(without)}, tokens),
                         TransformerLM(unnormed).apply({"params": without}, tokens), atol=1e-2)


def test_z_loss_adds_the_squared_log_normalizer_to_the_objective_and_its_gradient_shrinks_it():
  cfg = ModelConfig(num_layers=1, d_model=32, num_heads=2, mlp_dim=64, max_len=16)
  params = lm.init_params(cfg, jax.random.key(1))
  batch = jnp.asarray(np.random.default_rng(1).integers(0, 256, (4, 17)), jnp.int32)
  plain_objective, plain_ce = lm.train_loss(params, cfg, batch)
  assert float(plain_objective) == float(plain_ce) == float(lm.loss_fn(params, cfg, batch))
  with_z = ModelConfig(num_layers=1, d_model=32, num_heads=2, mlp_dim=64, max_len=16, z_loss=0.5)
  objective, ce = lm.train_loss(params, with_z, batch)
  logits = TransformerLM(cfg).apply({"params": params}, batch[:, :-1])
  log_z = jax.nn.logsumexp(logits, axis=-1)
  np.testing.assert_allclose(float(ce), float(plain_ce), rtol=1e-6)
  np.testing.assert_allclose(float(objective), float(ce) + 0.5 * float(jnp.mean(log_z**2)), rtol=1e-5)
  # A step down the z-loss alone moves log Z towards 0.
  z_only = lambda p: lm.train_loss(p, with_z, batch)[0] - lm.train_loss(p, with_z, batch)[1]
  grads = jax.grad(z_only)(params)
  stepped = jax.tree.map(lambda p, g: p - 1e-2 * g, params, grads)
  after = jax.nn.logsumexp(TransformerLM(cfg).apply({"params": stepped}, batch[:, :-1]), axis=-1)
  assert float(jnp.mean(after**2)) < float(jnp.mean(log_z**2))


def _llama(**fields):
  return ModelConfig(kind="llama", num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=48, max_len=16,
                     **fields)


def test_the_llama_model_is_causal_too():
  cfg = _llama()
  module = lm.interface.spec_of("llama").module(cfg)
  tokens_1xL = jnp.asarray(np.random.default_rng(0).integers(0, 256, (1, 16)), jnp.int32)
  variables = module.init(jax.random.key(0), tokens_1xL)
  grad = jax.grad(lambda p: module.apply({"params": variables["params"], "perturbations": p}, tokens_1xL)[0, 7].sum())(
      variables["perturbations"])["embedded"]
  assert np.abs(np.asarray(grad[0, 8:])).max() == 0.0 and (np.abs(np.asarray(grad[0, :8])).sum(-1) > 0).all()


def test_grouped_query_attention_matches_a_reference_written_out_head_by_head():
  from models import attention  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  q, k, v = (rng.normal(size=(1, 5, h, 8)).astype(np.float32) for h in (4, 2, 2))
  out = np.asarray(attention.attend(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), "float32"))
  for h in range(4):  # query heads 0, 1 read key/value head 0; heads 2, 3 read head 1 (transformers' repeat_kv)
    g = h // 2
    for t in range(5):
      scores = q[0, t, h] @ k[0, :t + 1, g].T / np.sqrt(8)
      weights = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
      np.testing.assert_allclose(out[0, t, h], weights @ v[0, :t + 1, g], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cfg", [ModelConfig(num_layers=2, d_model=32, num_heads=4, mlp_dim=64, max_len=16),
                                 ModelConfig(num_layers=2, d_model=32, num_heads=4, mlp_dim=64, max_len=16,
                                             positions="learned", qk_norm=True),
                                 _llama(qk_norm=True), _llama(tied_embeddings=False)],
                         ids=["gpt", "gpt-learned-qk", "llama-qk", "llama-untied"])
def test_decoding_with_the_cache_gives_the_full_forward_passs_logits(cfg):
  params = lm.init_params(cfg, jax.random.key(0))
  tokens_1xL = jnp.asarray(np.random.default_rng(2).integers(0, 256, (1, 16)), jnp.int32)
  full = np.asarray(lm.logits(params, cfg, tokens_1xL))
  logits, cache = lm.decode(params, cfg, lm.empty_cache(cfg, 1), tokens_1xL.at[:, 6:].set(0))  # padded prefill
  cache = lm.at_position(cache, 6)
  np.testing.assert_allclose(np.asarray(logits)[0, :6], full[0, :6], atol=2e-5)
  for i in range(6, 16):
    step, cache = lm.decode(params, cfg, cache, tokens_1xL[:, i:i + 1])
    np.testing.assert_allclose(np.asarray(step)[0, 0], full[0, i], atol=2e-5)
