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
