"""Checkpoint reader: `config.json`, `model.safetensors.index.json` and every shard's safetensors header.

A safetensors file is an 8-byte little-endian header length, a JSON header (tensor name -> dtype,
shape, data_offsets relative to the end of the header), then the raw tensor bytes. Read here with
the standard library. Anything that is not a well-formed checkpoint is a UserError naming the file:
a malformed index or header, a shard shorter than its header declares (a truncated download), or an
index that names a file outside the checkpoint folder.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ornith_stack.errors import UserError
from ornith_stack.reading import read_json_object, require_regular

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CONFIG = "config.json"
# A header larger than this is not a safetensors header (the format caps it at 100 MB).
MAX_HEADER_BYTES = 100 * (1 << 20)
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                           "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offset of the data in `file`
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class Checkpoint:
    path: Path
    config: dict[str, Any]
    tensors: dict[str, Tensor]
    index_total_size: int | None

    @property
    def total_bytes(self) -> int:
        return self.index_total_size or sum(t.nbytes for t in self.tensors.values())

    def bytes_where(self, predicate: Callable[[str], bool]) -> int:
        return sum(t.nbytes for t in self.tensors.values() if predicate(t.name))

    @property
    def text_config(self) -> dict[str, Any]:
        text = self.config.get("text_config")
        return text if isinstance(text, dict) else self.config


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """(header, data start) of one safetensors file; a malformed file is a UserError naming it."""
    require_regular(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise UserError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise UserError(f"{path}: not a safetensors file (header length {length} in a file of "
                                f"{size} bytes)")
            header = json.loads(fh.read(length))
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: safetensors header is not a JSON object")
    return header, 8 + length


def tensors_of(path: Path) -> dict[str, Tensor]:
    """Every tensor of one safetensors file, checked against the file's real length."""
    header, base = read_safetensors_header(path)
    tensors = {name: _tensor(path, name, info, base) for name, info in header.items() if name != "__metadata__"}
    data_end = max((t.end for t in tensors.values()), default=base)
    size = path.stat().st_size
    if data_end > size:
        raise UserError(f"{path}: truncated: its header declares {data_end - base:,} bytes of tensor data, "
                        f"the file holds {size - base:,} (an interrupted download? fetch it again)")
    return tensors


def _tensor(path: Path, name: str, info: Any, base: int) -> Tensor:
    try:
        begin, end = info["data_offsets"]
        dtype, shape = str(info["dtype"]), tuple(info["shape"])
        well_formed = all(isinstance(v, int) and v >= 0 for v in (begin, end, *shape)) and begin <= end
    except (KeyError, TypeError, ValueError):
        well_formed = False
    if not well_formed:
        raise UserError(f"{path}: tensor {name!r} has no valid dtype/shape/data_offsets in the header")
    width = SAFETENSORS_DTYPE_BYTES.get(dtype)
    if width is not None and math.prod(shape) * width != end - begin:
        raise UserError(f"{path}: tensor {name!r} is {dtype} {list(shape)} ({math.prod(shape) * width:,} "
                        f"bytes) but its data_offsets span {end - begin:,} bytes")
    return Tensor(name, dtype, shape, path, base + begin, base + end)


def shard_path(folder: Path, index_path: Path, shard: object) -> Path:
    """The file a weight_map entry names, which must lie inside `folder` (no absolute path, no '..')."""
    name = PurePosixPath(str(shard))
    if not isinstance(shard, str) or not shard or name.is_absolute() or ".." in name.parts:
        raise UserError(f"{index_path}: weight_map names {shard!r}, a file outside {folder}: refused")
    return folder / name


def read_checkpoint(path: Path) -> Checkpoint:
    """config.json + index (or a single model.safetensors) + every shard's header."""
    if not path.is_dir():
        raise UserError(f"--weights {path}: not a directory")
    config = read_json_object(path / CONFIG)
    index_path = path / INDEX
    if index_path.is_file():
        return _read_indexed(path, index_path, config)
    if (path / SINGLE).is_file():
        return Checkpoint(path, config, tensors_of(path / SINGLE), None)
    raise UserError(f"{path}: neither {INDEX} nor {SINGLE} is present")


def _read_indexed(path: Path, index_path: Path, config: dict[str, Any]) -> Checkpoint:
    index = read_json_object(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{index_path}: key 'weight_map' is missing or empty")
    metadata = index.get("metadata") or {}
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total <= 0):
        raise UserError(f"{index_path}: key 'metadata.total_size' must be a positive integer, got {total!r}")
    shards = {shard_path(path, index_path, shard) for shard in weight_map.values()}
    tensors: dict[str, Tensor] = {}
    for shard in sorted(shards):
        if not shard.is_file():
            raise UserError(f"{index_path}: weight_map names {shard.name!r}, which is missing from {path}")
        tensors.update(tensors_of(shard))
    missing = [n for n in weight_map if n not in tensors]
    if missing:
        raise UserError(f"{index_path}: {len(missing)} tensor(s) in weight_map are not in their shard, "
                        f"e.g. {missing[0]!r}")
    return Checkpoint(path, config, tensors, total)


def is_mtp(name: str) -> bool:
    return name.startswith("mtp.") or ".mtp." in name


def is_visual(name: str) -> bool:
    return "visual." in name


def row_is_zero(tensor: Tensor, row: int) -> bool:
    """Whether row `row` of a 2-D tensor is all zeros (either sign), read straight from the file."""
    width = SAFETENSORS_DTYPE_BYTES.get(tensor.dtype)
    if width is None or len(tensor.shape) != 2:
        raise UserError(f"{tensor.file}: {tensor.name} is {tensor.dtype} {list(tensor.shape)}, not a 2-D float matrix")
    row_bytes = tensor.shape[1] * width
    with tensor.file.open("rb") as fh:
        fh.seek(tensor.start + row * row_bytes)
        data = fh.read(row_bytes)
    sign_mask = {1: 0x7F, 2: 0x7FFF, 4: 0x7FFFFFFF, 8: 0x7FFFFFFFFFFFFFFF}[width]
    fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[width]
    return all(v & sign_mask == 0 for v in struct.unpack(f"<{len(data) // width}{fmt}", data))


def embedding_tensor(ckpt: Checkpoint) -> Tensor | None:
    return next((t for n, t in sorted(ckpt.tensors.items())
                 if n.endswith("embed_tokens.weight") and not is_mtp(n)), None)
