"""The syncer's memory and merge time at scale: `python -m launch.bench_syncer`.

Flags: --params (model size, real fp32 arrays), --vocab, --learners, --up, --down, --base, --fragments and --shards
(comma-separated: every combination is measured), --rounds. Prints a Markdown table of the bytes each structure holds
per parameter, the largest shard's, and the merge time (docs/results/syncer.md). Needs about (M + 2) × 2 × params × 4
bytes of RAM per row (~0.6 GB at the defaults with M = 16).
"""

from absl import flags

from runtime import cli
from runtime.bench import syncer_memory
from runtime.cluster import devices as devices_lib

_DEFAULTS = syncer_memory.SyncerBenchConfig()
_PARAMS = flags.DEFINE_integer("params", _DEFAULTS.params, "Model size the tensors total.")
_VOCAB = flags.DEFINE_integer("vocab", _DEFAULTS.vocab, "Embedding rows (the largest tensor: shards hold whole ones).")
_LEARNERS = flags.DEFINE_list("learners", ["4", "8", "16"], "M values, each with quorum K = 1.")
_UP = flags.DEFINE_list("up", ["none", "int4"], "compression.up values (reports as payloads when not none).")
_DOWN = flags.DEFINE_list("down", ["none", "int4"], "compression.down values (a mirror per learner when not none).")
_BASE = flags.DEFINE_list("base", [_DEFAULTS.base], "outer.outer_grad_base values: current, base.")
_FRAGMENTS = flags.DEFINE_list("fragments", ["1", "4"], "Fragment counts P (P > 1: uncompressed rows only).")
_SHARDS = flags.DEFINE_list("shards", ["1", "4"], "syncer.shards values: host CPU devices the syncer is split over.")
_ROUNDS = flags.DEFINE_integer("rounds", _DEFAULTS.rounds, "Reports per learner before the count.")


def main(argv: list[str]) -> None:
  """Builds one config per combination of the flags and prints the table."""
  del argv  # Unused: everything comes from flags.
  devices_lib.configure_simulated_devices(max(int(s) for s in _SHARDS.value))  # (before JAX starts)
  configs = [syncer_memory.SyncerBenchConfig(params=_PARAMS.value, vocab=_VOCAB.value, learners=int(m), up=up,
                                             down=down, base=base, fragments=int(p), shards=int(s),
                                             rounds=_ROUNDS.value)
             for m in _LEARNERS.value for up in _UP.value for down in _DOWN.value for base in _BASE.value
             for p in _FRAGMENTS.value for s in _SHARDS.value
             if int(p) == 1 or up == down == "none"]  # (fragments travel uncompressed)
  cli.guarded(lambda: print(syncer_memory.table([syncer_memory.run(c) for c in configs])))

if __name__ == "__main__":
  cli.run(main)
