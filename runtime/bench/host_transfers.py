"""Benchmark: a report's way up and Θ's way down between a learner's device and the host, packed, by the copy route
and by the pinned route (runtime/train/tree_transfer.py, `route`): GB/s each way, the median of the timed runs after
a warm-up.

Packed: `send` (packed on the source device, crossed, unpacked on the target: every tree's way before large leaves
went one by one). Copy: `copy_to` (packed, or leaf by leaf between devices of one platform). Up, pinned: `stage` (one
transfer into the device's pinned host memory) and its landing on the host. Down, pinned: Θ packed once on the host
(counted here: one learner) and sent through the device's pinned host memory where the device is not the host's.
Every side's result is checked equal to its source once.
"""

import dataclasses
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding

from runtime.bench import merge as merge_bench
from runtime.cluster import devices as devices_lib
from runtime.errors import ConfigError
from runtime.train import tree_transfer

PyTree = Any
SIDES = ("up, packed", "up, copy", "up, pinned", "down, packed", "down, copy", "down, pinned")


@dataclasses.dataclass(frozen=True)
class HostTransferBenchConfig:
  params: int = 100_000_000  # float32 entries of the tree sent (GPT-2-small-like shapes): 400 MB at the default
  repeats: int = 5  # timed runs of each side, interleaved, after one warm-up each

  def __post_init__(self) -> None:
    for field in ("params", "repeats"):
      if getattr(self, field) < 1:
        raise ConfigError(field, getattr(self, field), "an integer >= 1")


def _learner_device() -> jax.Device:
  """The accelerator's first device; on a CPU-only host, its last simulated device (the host's is the first)."""
  devices = jax.devices()
  return devices[-1] if devices[0].platform == "cpu" else devices[0]


def _tree(shapes: PyTree, sharding: SingleDeviceSharding, seed: int) -> PyTree:
  leaves, treedef = jax.tree.flatten(shapes, is_leaf=merge_bench.is_shape)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  make = jax.jit(lambda key, shape: jax.random.normal(key, shape, jnp.float32), static_argnums=1,
                 out_shardings=sharding)
  return jax.tree.unflatten(treedef, [make(k, tuple(s)) for k, s in zip(keys, leaves)])


def run(config: HostTransferBenchConfig) -> dict[str, list[float]]:
  """Times the six sides, interleaved so all see the same load; prints and returns their seconds."""
  devices_lib.configure_simulated_devices(2)  # (on a CPU-only host: a learner's device apart from the host's)
  device, host = _learner_device(), devices_lib.host_device()
  on_device, on_host = SingleDeviceSharding(device), SingleDeviceSharding(host)
  shapes = merge_bench.transformer_shapes(config.params)
  report, theta = _tree(shapes, on_device, 0), _tree(shapes, on_host, 1)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(report))
  sides: dict[str, Callable[[], PyTree]] = {
      "up, packed": lambda: tree_transfer.send(report, on_host),
      "up, copy": lambda: tree_transfer.copy_to(report, on_host),
      "up, pinned": lambda: tree_transfer.copy_to(tree_transfer.stage(report), on_host),
      "down, packed": lambda: tree_transfer.send(theta, on_device),
      "down, copy": lambda: tree_transfer.copy_to(theta, on_device),
      "down, pinned": lambda: tree_transfer.copy_to(tree_transfer.Shared(theta), on_device),
  }
  seconds: dict[str, list[float]] = {side: [] for side in SIDES}
  for side, send in sides.items():  # the warm-up: compiles, and checks the bits
    out = jax.block_until_ready(send())
    source = report if side.startswith("up") else theta
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(out), jax.device_get(source))
  for _ in range(config.repeats):
    for side, send in sides.items():
      started = time.perf_counter()
      jax.block_until_ready(send())
      seconds[side].append(time.perf_counter() - started)
  print(f"host transfers: {nbytes / 1e6:.0f} MB, {device} <-> {host}; the default (auto) takes the "
        f"{tree_transfer.route('auto')} route here, asked for pinned the {tree_transfer.route('pinned')} route; "
        f"median of {config.repeats}")
  print("| side | GB/s | median s |\n|---|---|---|")
  for side in SIDES:
    median = statistics.median(seconds[side])
    print(f"| {side} | {nbytes / median / 1e9:.2f} | {median:.4f} |")
  return seconds
