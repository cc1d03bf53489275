"""CmfFile: a CMF v2 file on a read-only memory map (docs/FORMAT.md).

`open` reads and checks only the metadata (envelope, header JSON, directory) and raises CmfError
for every hard-error case of the format; tensor payloads stay on the map, zero-copy, until asked.
"""

from __future__ import annotations

import json
import mmap
import os
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from cortiq_drv.cmf import f16, layout as L, q4tp, q8
from cortiq_drv.cmf.hash import hash64
from cortiq_drv.cmf.layout import TensorInfo
from cortiq_drv.errors import CmfError


def _envelope(path: str, buf, size: int) -> dict:
    """Check the envelope; its fields as a dict with (off, len) pairs under the section names."""
    magic, version, flags, feats, *rest = L.ENVELOPE.unpack_from(buf, 0)
    if magic != L.MAGIC:
        raise CmfError(f"{path}: bad magic {magic!r}, not a CMF file")
    if version != L.VERSION:
        raise CmfError(f"{path}: CMF version {version}, only version 2 is supported")
    unknown = feats & ~L.KNOWN_FEATURES
    if unknown:
        raise CmfError(f"{path}: unknown required feature bit(s) {unknown:#x}")
    if feats & L.SKILL_FILE:
        raise CmfError(f"{path}: SKILL_FILE feature: a skill file, not a runnable model")
    if not feats & L.TENSOR_DIR:
        raise CmfError(f"{path}: required feature TENSOR_DIR is not set")
    env = {"flags": flags, "features": feats, "header_hash": rest[12], "dir_hash": rest[13]}
    for i, name in enumerate(L.SECTIONS):
        off, n = rest[2 * i], rest[2 * i + 1]
        if off + n > size:
            raise CmfError(f"{path}: {name} section [{off}, {off + n}) past the end of the file "
                           f"({size} bytes; truncated?)")
        env[name] = (off, n)
    if env["data"][0] % L.DATA_ALIGN:
        raise CmfError(f"{path}: data_off {env['data'][0]} is not a multiple of 4096")
    return env


def _check_record(path: str, name: str, rec, data_len: int) -> tuple[int, ...]:
    """Check one directory record; its shape."""
    did, ndim = int(rec["dtype"]), int(rec["ndim"])
    if did not in L.DTYPE_NAMES:
        raise CmfError(f"{path}: tensor {name!r}: unknown dtype id {did}")
    if ndim > L.MAX_NDIM:
        raise CmfError(f"{path}: tensor {name!r}: ndim {ndim} > 6")
    shape = tuple(int(d) for d in rec["shape"][:ndim])
    off, n = int(rec["off"]), int(rec["nbytes"])
    if off + n > data_len:
        raise CmfError(f"{path}: tensor {name!r} at [{off}, {off + n}) past the blob "
                       f"({data_len} bytes)")
    if off % L.SMALL_ALIGN:
        raise CmfError(f"{path}: tensor {name!r}: offset {off} is not a multiple of 64")
    try:
        want = L.payload_nbytes(did, shape)
    except CmfError as e:
        raise CmfError(f"{path}: tensor {name!r}: {e}") from None
    if want is not None and want != n:
        raise CmfError(f"{path}: tensor {name!r}: payload of {n} bytes, {L.DTYPE_NAMES[did]} "
                       f"{shape} needs {want}")
    return shape


def _directory(path: str, buf, env: dict) -> dict[str, TensorInfo]:
    dir_off, dir_len = env["dir"]
    data_off, data_len = env["data"]
    if dir_len < L.DIR_HEAD.size:
        raise CmfError(f"{path}: directory of {dir_len} bytes, shorter than its 16-byte head")
    # A copy (the directory is small): nothing keeps the map exported, so close() can unmap.
    raw = buf[dir_off:dir_off + dir_len]
    count, pool_off = L.DIR_HEAD.unpack_from(raw, 0)
    if L.DIR_HEAD.size + count * L.DIR_RECORD.itemsize > dir_len or pool_off > dir_len:
        raise CmfError(f"{path}: directory of {dir_len} bytes cannot hold {count} records "
                       f"and a name pool at {pool_off}")
    recs = np.frombuffer(raw, dtype=L.DIR_RECORD, count=count, offset=L.DIR_HEAD.size)
    pool = raw[pool_off:]
    out: dict[str, TensorInfo] = {}
    for i, rec in enumerate(recs):
        a, n = int(rec["name_off"]), int(rec["name_len"])
        if a + n > len(pool):
            raise CmfError(f"{path}: tensor #{i}: name [{a}, {a + n}) past the name pool")
        try:
            name = pool[a:a + n].decode("utf-8")
        except UnicodeDecodeError:
            raise CmfError(f"{path}: tensor #{i}: name is not UTF-8: {pool[a:a + n]!r}") from None
        if name in out:
            raise CmfError(f"{path}: tensor {name!r} appears twice in the directory")
        shape = _check_record(path, name, rec, data_len)
        out[name] = TensorInfo(name, L.DTYPE_NAMES[int(rec["dtype"])], shape,
                               data_off + int(rec["off"]), int(rec["nbytes"]), int(rec["hash"]))
    return out


def _header(path: str, buf, env: dict) -> dict:
    off, n = env["header"]
    try:
        doc = json.loads(buf[off:off + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CmfError(f"{path}: header is not UTF-8 JSON: {e}") from None
    if not isinstance(doc, dict):
        raise CmfError(f"{path}: header JSON is not an object")
    return doc


def decode_payload(raw: np.ndarray, dtype: str, shape: tuple[int, ...], where: str = "payload"):
    """A payload (uint8 bytes) of `dtype` decoded to float32 in `shape` (f32: a view, no copy)."""
    if dtype == "f32":
        return raw.view("<f4").reshape(shape)
    if dtype == "f16":
        return f16.from_f16(raw.view("<u2")).reshape(shape)
    if dtype == "bf16":
        return f16.from_bf16(raw.view("<u2")).reshape(shape)
    if dtype == "q4tp":
        return q4tp.decode(raw, *shape)
    if dtype == "q8_2f":
        return q8.decode(raw, *shape)
    raise CmfError(f"{where}: unsupported dtype {dtype} "
                   "(this project decodes f32, f16, bf16, q8_2f, q4tp)")


class CmfFile:
    """An open CMF v2 file. `CmfFile.open(path)`; `close()` or use as a context manager."""

    def __init__(self, path: str, f, buf, env: dict, header: dict, tensors: dict):
        self.path = path
        self._f, self._buf, self._env = f, buf, env
        self.header = header
        self._tensors = tensors

    @classmethod
    def open(cls, path) -> "CmfFile":
        path = os.fspath(path)
        f, buf = open(path, "rb"), None
        try:
            size = os.fstat(f.fileno()).st_size
            if size < L.ENVELOPE_SIZE:
                raise CmfError(f"{path}: truncated: {size} bytes, shorter than the 128-byte "
                               "envelope")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            env = _envelope(path, buf, size)
            return cls(path, f, buf, env, _header(path, buf, env), _directory(path, buf, env))
        except BaseException:
            if buf is not None:
                buf.close()
            f.close()
            raise

    @property
    def arch(self) -> dict:
        """The header's `arch` object ({} when absent)."""
        return self.header.get("arch", {})

    @property
    def features(self) -> int:
        """The envelope's required_features bitmask."""
        return self._env["features"]

    @property
    def tensors(self) -> Mapping[str, TensorInfo]:
        """name -> TensorInfo, in directory order (read-only)."""
        return MappingProxyType(self._tensors)

    def info(self, name: str) -> TensorInfo:
        if name not in self._tensors:
            raise CmfError(f"{self.path}: no tensor {name!r}")
        return self._tensors[name]

    def tensor(self, name: str) -> np.ndarray:
        """The raw payload bytes: a read-only uint8 view of the map (no copy)."""
        t = self.info(name)
        return np.frombuffer(self._map(), dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def array(self, name: str) -> np.ndarray:
        """The tensor decoded to float32 in its shape (f32: a read-only view of the map)."""
        t = self.info(name)
        return decode_payload(self.tensor(name), t.dtype, t.shape, f"{self.path}: tensor {name!r}")

    @property
    def vocab(self) -> bytes | None:
        """The vocab section (a Hugging Face tokenizer.json, verbatim) or None."""
        off, n = self._env["vocab"]
        return bytes(self._map()[off:off + n]) if n else None

    def _section_hash(self, name: str) -> int:
        off, n = self._env[name]
        return hash64(self._map()[off:off + n])

    @property
    def uid(self) -> str:
        """A stable id of the file's content: hash64 over the header and directory hashes (the
        directory holds every tensor's hash), as 16 hex digits."""
        hh = self._env["header_hash"] or self._section_hash("header")
        dh = self._env["dir_hash"] or self._section_hash("dir")
        return f"{hash64(hh.to_bytes(8, 'little') + dh.to_bytes(8, 'little')):016x}"

    def verify(self, progress: Callable[[str, int], None] | None = None) -> int:
        """Check the header and directory hashes and every tensor's hash; the payload bytes
        checked. CmfError naming every mismatch. `progress(name, nbytes)` after each tensor."""
        bad = []
        for sec, key in (("header", "header_hash"), ("dir", "dir_hash")):
            stored = self._env[key]
            if stored and stored != self._section_hash(sec):
                bad.append(f"{sec} JSON" if sec == "header" else "directory")
        done = 0
        for t in self._tensors.values():
            if hash64(self.tensor(t.name)) != t.hash:
                bad.append(f"tensor {t.name!r}")
            done += t.nbytes
            if progress:
                progress(t.name, t.nbytes)
        if bad:
            raise CmfError(f"{self.path}: hash mismatch in " + ", ".join(bad))
        return done

    def _map(self):
        if self._buf is None:
            raise CmfError(f"{self.path}: file is closed")
        return self._buf

    def close(self) -> None:
        """Unmap and close. Arrays still viewing the map keep it alive until they go."""
        if self._buf is not None:
            try:
                self._buf.close()
            except BufferError:
                # Views handed out still reference the map; it is unmapped when they are freed.
                pass
            self._buf = None
            self._f.close()

    def __enter__(self) -> "CmfFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
