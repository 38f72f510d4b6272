"""A compressed report's bytes on the wire: the parts' sizes, the parts, and a CRC-32 over both.

The header holds one uint32 byte count per part and the CRC-32; the receiver knows what every part should
be (from the config and the model) and rejects a payload whose sizes, length or checksum disagree, so a
corrupt or truncated report is quarantined, never decoded into Θ.
"""

import dataclasses
import zlib
from typing import Sequence

import numpy as np

_U32 = np.dtype("<u4")


class CorruptPayload(ValueError):
  """A payload's bytes are not what its sender produced; the message says what disagrees."""


@dataclasses.dataclass(frozen=True)
class Payload:
  """The bytes of one compressed report, exactly as they travel."""

  blob: bytes

  @property
  def nbytes(self) -> int:
    return len(self.blob)


def pack(parts: Sequence[np.ndarray]) -> Payload:
  """Header (part sizes, CRC-32 of sizes and parts) followed by every part's bytes, in order."""
  data = [np.ascontiguousarray(p).tobytes() for p in parts]
  sizes = np.asarray([len(d) for d in data], _U32).tobytes()
  body = sizes + b"".join(data)
  return Payload(np.asarray([zlib.crc32(body)], _U32).tobytes() + body)


def unpack(payload: Payload, specs: Sequence[tuple[np.dtype, int]]) -> list[np.ndarray]:
  """The parts of a payload, each of its spec's (dtype, count); raises CorruptPayload if anything disagrees."""
  blob, head = payload.blob, 4 + 4 * len(specs)
  expected = [np.dtype(dtype).itemsize * count for dtype, count in specs]
  if len(blob) != head + sum(expected):
    raise CorruptPayload(f"{len(blob)} bytes where {head + sum(expected)} were sent")
  if np.frombuffer(blob[:4], _U32)[0] != zlib.crc32(blob[4:]):
    raise CorruptPayload("checksum mismatch")
  if np.frombuffer(blob[4:head], _U32).tolist() != expected:
    raise CorruptPayload("part sizes differ from the codec's")
  parts, at = [], head
  for (dtype, count), size in zip(specs, expected):
    parts.append(np.frombuffer(blob, dtype, count, at).copy())
    at += size
  return parts


def corrupted(payload: Payload, how: str) -> Payload:
  """The payload damaged on the wire (fault injection): one bit flipped mid-payload, or its last byte cut."""
  if how == "truncate":
    return Payload(payload.blob[:-1])
  blob = bytearray(payload.blob)
  blob[len(blob) // 2] ^= 0x10
  return Payload(bytes(blob))


def snapshot(packer, payload: Payload | None) -> dict | None:
  """A payload in a checkpoint (runtime/checkpoint/snapshot.py): its bytes as one uint8 array."""
  return None if payload is None else packer.tree({"blob": np.frombuffer(payload.blob, np.uint8)}, "dict")


def restored(unpacker, encoded: dict | None) -> Payload | None:
  return None if encoded is None else Payload(unpacker.tree(encoded, lambda x, _: x, where="bytes")["blob"].tobytes())
