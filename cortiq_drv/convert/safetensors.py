"""Safetensors checkpoints read by parsing the header and memory-mapping the data (no torch).

A file is `u64 header_len`, a UTF-8 JSON header `{name: {dtype, shape, data_offsets: [b, e]}}`
(plus an optional `__metadata__`), then the data; offsets are relative to the end of the header.
`Checkpoint.open(dir)` takes `model.safetensors`, a sharded set named by
`model.safetensors.index.json`, or every `*.safetensors` file of the directory. Tensors are
decoded to float32 one at a time, on request, so a conversion never holds the whole model.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cortiq_drv.cmf import f16
from cortiq_drv.errors import ConvertError

# Bytes per element of every dtype the format defines (sizes are checked for all of them).
_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
# The source dtypes this converter decodes.
SUPPORTED = ("BF16", "F16", "F32")
# A header larger than this is not a safetensors header (the format caps it at 100 MB).
_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    begin: int  # absolute byte offset in `file`
    nbytes: int


class Shard:
    """One safetensors file: its parsed header and a read-only memory map."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 8:
                raise ConvertError(f"{path}: not a safetensors file ({size} bytes)")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (hlen,) = struct.unpack_from("<Q", self._mm, 0)
        if hlen > min(size - 8, _MAX_HEADER):
            raise ConvertError(f"{path}: safetensors header length {hlen} exceeds the file ({size} bytes)")
        try:
            header = json.loads(bytes(self._mm[8:8 + hlen]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConvertError(f"{path}: safetensors header is not valid JSON: {e}") from None
        if not isinstance(header, dict):
            raise ConvertError(f"{path}: safetensors header is not a JSON object")
        start = 8 + hlen
        self.infos = {k: self._entry(k, v, start, size) for k, v in header.items() if k != "__metadata__"}

    def _entry(self, name: str, v, start: int, size: int) -> TensorInfo:
        """Validate one header entry: keys, shape, offsets inside the file, byte count."""
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(v, dict) or not {"dtype", "shape", "data_offsets"} <= v.keys():
            raise ConvertError(f"{where}: header entry needs dtype, shape and data_offsets")
        dtype, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise ConvertError(f"{where}: bad shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                and 0 <= offs[0] <= offs[1] and start + offs[1] <= size):
            raise ConvertError(f"{where}: data_offsets {offs!r} outside the data ({size - start} bytes)")
        nbytes = offs[1] - offs[0]
        item = _ITEMSIZE.get(dtype)
        if item is not None and nbytes != item * int(np.prod(shape, dtype=np.int64)):
            raise ConvertError(f"{where}: {nbytes} bytes for {dtype} {shape}")
        return TensorInfo(name, str(dtype), tuple(shape), self.path, start + offs[0], nbytes)

    def raw(self, info: TensorInfo) -> memoryview:
        return memoryview(self._mm)[info.begin:info.begin + info.nbytes]

    def close(self) -> None:
        self._mm.close()


def to_f32(info: TensorInfo, raw) -> np.ndarray:
    """Decode a tensor's bytes (BF16, F16 or F32) to a float32 array of its shape."""
    if info.dtype == "F32":
        out = np.frombuffer(raw, dtype="<f4").copy()
    elif info.dtype == "F16":
        out = f16.from_f16(np.frombuffer(raw, dtype="<u2"))
    elif info.dtype == "BF16":
        out = f16.from_bf16(np.frombuffer(raw, dtype="<u2"))
    else:
        raise ConvertError(f"tensor {info.name!r}: unsupported dtype {info.dtype} "
                           f"(supported: {', '.join(SUPPORTED)})")
    return out.reshape(info.shape)


class Checkpoint:
    """Every tensor of a (possibly sharded) safetensors checkpoint, by name."""

    def __init__(self, shards: list[Shard], where: dict[str, Shard]):
        self._shards = shards
        self._where = where

    @classmethod
    def open(cls, src: str | Path) -> Checkpoint:
        src = Path(src)
        index = src / "model.safetensors.index.json"
        if index.is_file():
            return cls._open_index(src, index)
        files = [src / "model.safetensors"] if (src / "model.safetensors").is_file() \
            else sorted(src.glob("*.safetensors"))
        if not files:
            raise ConvertError(f"{src}: no *.safetensors files")
        shards = [Shard(p) for p in files]
        where: dict[str, Shard] = {}
        for s in shards:
            for name in s.infos:
                if name in where:
                    raise ConvertError(f"tensor {name!r} appears in {where[name].path.name} and {s.path.name}")
                where[name] = s
        return cls(shards, where)

    @classmethod
    def _open_index(cls, src: Path, index: Path) -> Checkpoint:
        """A sharded checkpoint: `weight_map` names the file of every tensor."""
        try:
            wmap = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConvertError(f"{index}: bad index ({e!r}; needs key 'weight_map')") from None
        for f in sorted(set(wmap.values())):
            if not (src / f).is_file():
                raise ConvertError(f"{index}: shard {f} is missing")
        shards = {f: Shard(src / f) for f in sorted(set(wmap.values()))}
        where = {}
        for name, f in wmap.items():
            if name not in shards[f].infos:
                raise ConvertError(f"tensor {name!r}: index names {f}, which does not hold it")
            where[name] = shards[f]
        return cls(list(shards.values()), where)

    def names(self) -> list[str]:
        return list(self._where)

    def info(self, name: str) -> TensorInfo:
        return self._where[name].infos[name]

    def array(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        """The tensor decoded to float32 (a copy: the map can close afterwards); with `rows`
        (r0, r1) only that band of the first dimension, read from the map alone."""
        s = self._where[name]
        info = s.infos[name]
        if rows is None:
            return to_f32(info, s.raw(info))
        r0, r1 = rows
        row_bytes = info.nbytes // max(info.shape[0], 1)
        band = TensorInfo(name, info.dtype, (r1 - r0, *info.shape[1:]), info.file,
                          info.begin + r0 * row_bytes, (r1 - r0) * row_bytes)
        return to_f32(band, s.raw(band))

    def close(self) -> None:
        for s in self._shards:
            s.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def save(path: str | Path, tensors: dict[str, np.ndarray], dtype: str = "BF16") -> None:
    """Write `tensors` (float arrays) as one safetensors file in `dtype` (BF16, F16 or F32)."""
    enc = {"BF16": f16.to_bf16, "F16": f16.to_f16, "F32": lambda a: a.astype("<f4")}[dtype]
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(enc(np.asarray(a, dtype=np.float32))).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(a)), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj)
        for b in blobs:
            f.write(b)
