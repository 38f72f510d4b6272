"""What a preparation keeps under `<output>/.prepare/` to be resumed: its plan, its tokenizer's kind, shard markers.

The plan is the input (every file's range, size and modification time) and the settings that shape the shards; a
rerun with another plan is refused, naming what differs. A shard is done when its marker is written and its files
still match the checksums the marker records; the rest are written again.
"""

import json
import os
import pathlib
from typing import Any

from runtime.data import manifest as manifest_lib, tokenizers
from runtime.errors import DataError

STATE_DIR = ".prepare"


class Preparation:
  """What a preparation keeps under `<output>/.prepare/`: its plan, the tokenizer's kind, a marker per shard."""

  def __init__(self, out: pathlib.Path, plan: dict[str, Any]):
    self._out, self._dir = out, out / STATE_DIR
    plan_file = self._dir / "plan.json"
    if plan_file.is_file():
      kept = json.loads(plan_file.read_text())
      for key, value in plan.items():
        if kept.get(key) != value:
          what = "input files" if key == "pieces" else key
          raise DataError(f"--output = {str(out)!r} holds a preparation of other {what} ({_differs(kept, plan, key)}); "
                          "use another --output, or remove it to start again")
      self._plan = kept
    else:
      if manifest_lib.path_of(str(out)) is not None:
        raise DataError(f"--output = {str(out)!r} already holds a prepared dataset made elsewhere; "
                        "use another --output")
      self._dir.mkdir(parents=True, exist_ok=True)
      self._plan = dict(plan, tokenizer_kind=None, adjust={})
      self._save()

  def tokenizer(self) -> tokenizers.Tokenizer | None:
    kind = self._plan["tokenizer_kind"]
    return None if kind is None else tokenizers.load(kind, self._out)

  def keep_tokenizer(self, tokenizer: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    tokenizer.save(self._out)
    self._plan["tokenizer_kind"] = tokenizer.kind
    self._save()
    return tokenizer

  def adjustment(self, index: int) -> dict[str, Any]:
    return self._plan["adjust"].get(str(index), {})

  def set_adjustment(self, index: int, change: dict[str, Any]) -> None:
    self._plan["adjust"] = {str(index): change}
    self._save()

  def marker(self, index: int) -> dict[str, Any]:
    return json.loads(marker_path(self._out, index).read_text())

  def done(self, index: int) -> bool:
    """Whether shard `index` is complete: its marker written and its files matching the marker's checksums."""
    path = marker_path(self._out, index)
    if not path.is_file():
      return False
    marker = json.loads(path.read_text())
    try:
      manifest_lib.verify(self._out, [marker[s] for s in manifest_lib.SPLITS if marker[s] is not None])
    except DataError:
      return False
    return True

  def _save(self) -> None:
    tmp = self._dir / f".plan.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(self._plan))
    os.replace(tmp, self._dir / "plan.json")


def _differs(kept: dict, plan: dict, key: str) -> str:
  if key == "pieces":
    return "files were added, removed or changed since"
  if key == "input":
    return f"--input was {kept[key]!r}"
  return ", ".join((f"{k} was {kept[key][k]!r}" if k in kept[key] else f"{k} unknown to the version that began it")
                   + f", now {v!r}" for k, v in plan[key].items() if kept[key].get(k) != v)


def marker_path(out: pathlib.Path, index: int) -> pathlib.Path:
  return out / STATE_DIR / f"shard-{index:05d}.json"
