"""The controller's device set: simulated CPU devices, slices, and per-slice meshes."""

import os
import re
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from runtime.cluster import multislice
from runtime.errors import ConfigError


def configure_simulated_devices(num_devices: int) -> None:
  """Asks for `num_devices` CPU devices before JAX starts a backend (no effect on accelerators).

  Once a backend is running (a test session, a notebook) the device count is fixed;
  `controller_devices` then checks that enough are there.
  """
  from_flags = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
  wanted = max(num_devices, jax.config.jax_num_cpu_devices, int(from_flags.group(1)) if from_flags else 1)
  try:
    jax.config.update("jax_num_cpu_devices", wanted)
  except RuntimeError:
    pass


def controller_devices(num_devices: int) -> list[jax.Device]:
  """The devices the controller owns: all accelerators, or the first `num_devices` CPU devices."""
  devices = jax.devices()
  if devices[0].platform == "cpu":
    if len(devices) < num_devices:
      raise ConfigError("num_devices", num_devices,
                        f"at most the {len(devices)} CPU devices this process has (set before JAX starts)")
    return devices[:num_devices]
  return devices


def make_slices(devices: Sequence[jax.Device], num_slices: int, share: bool = False) -> list[list[jax.Device]]:
  """Groups devices into slices: by `slice_index` on multislice hardware, else equal consecutive groups; with
  `share` and fewer devices than slices, one device per slice, round-robin (slices on one device take turns)."""
  groups = multislice.slice_groups(devices)
  if groups is not None:
    if len(groups) != num_slices:
      raise ConfigError("slices", num_slices, f"the {len(groups)} hardware slices present")
    return groups
  if share and len(devices) < num_slices:
    if num_slices % len(devices):
      raise ConfigError("slices", num_slices, f"a multiple of the {len(devices)} devices when slices share them")
    return [[devices[i % len(devices)]] for i in range(num_slices)]
  if num_slices < 1 or len(devices) % num_slices:
    raise ConfigError("slices", num_slices, f"a divisor of the {len(devices)} devices")
  per_slice = len(devices) // num_slices
  return [list(devices[i * per_slice:(i + 1) * per_slice]) for i in range(num_slices)]


def slice_mesh(devices: Sequence[jax.Device], tensor: int = 1) -> Mesh:
  """A one-axis ('data') mesh over one slice's devices; with `tensor` > 1, ('data', 'tensor'), neighbouring devices
  in one tensor-parallel group."""
  if tensor == 1:
    return Mesh(np.asarray(devices), ("data",))
  return Mesh(np.asarray(devices).reshape(-1, tensor), ("data", "tensor"))


def learner_mesh(groups: Sequence[Sequence[jax.Device]], tensor: int = 1) -> Mesh:
  """A two-axis ('slice', 'data') mesh over a learner's slices (one row of devices per slice); with `tensor` > 1,
  ('slice', 'data', 'tensor')."""
  if tensor == 1:
    return Mesh(np.asarray(groups), ("slice", "data"))
  return Mesh(np.asarray(groups).reshape(len(groups), -1, tensor), ("slice", "data", "tensor"))


def host_device() -> jax.Device:
  """Where the syncer's state lives: the host CPU."""
  return jax.devices("cpu")[0]


def host_devices(num: int) -> list[jax.Device]:
  """The host CPU devices of a syncer in `num` shards, the first host_device() (simulated: they are also the CPU
  devices the learners' slices use)."""
  devices = jax.devices("cpu")
  if len(devices) < num:
    raise ConfigError("syncer.shards", num, f"at most the {len(devices)} host CPU devices this process has (set "
                      "before JAX starts: --xla_force_host_platform_device_count)")
  return devices[:num]


def configure_compilation_cache(path: str) -> None:
  """Persists compiled programs under `path` ('' = off): learners, modes and reruns share them."""
  if not path:
    return
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
