"""CmfWriter: streams tensors into a new CMF v2 file (docs/FORMAT.md), atomically.

Tensors go to disk as their bytes come (a payload may be an iterable of pieces), each hashed on
the way, so a 27B conversion never holds the model in memory. The blob starts after a reserved
gap for the header and directory, which are only known at the end; `finish` moves the blob when
they do not fit (or, for a small blob, to close the gap), writes header, directory, vocab and the
envelope, and renames the temporary file into place. Nothing half-written is left on error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from cortiq_drv.cmf import f16, layout as L, q4tp, q8
from cortiq_drv.cmf.hash import Hash64, hash64
from cortiq_drv.errors import CmfError

# Blobs up to this size are moved down to close the reserved gap; larger ones keep it.
_COMPACT_LIMIT = 64 << 20
_COPY_CHUNK = 16 << 20
# Element-wise encoders: float32 array -> payload bytes of the same elements.
_FLAT = {
    "f32": lambda a: np.ascontiguousarray(a, dtype="<f4"),
    "f16": lambda a: f16.to_f16(a).astype("<u2"),
    "bf16": lambda a: f16.to_bf16(a).astype("<u2"),
}
_CODECS = {"q4tp": q4tp.encode_iter, "q8_2f": q8.encode_iter}


def encode_iter(arr, dtype: str, chunk_rows: int | None = None):
    """The `dtype` payload of the float array `arr` as an iterable of pieces.

    With `chunk_rows`, `arr` may be anything with a `shape` whose row slices convert to float32
    (a lazy view of a checkpoint): it is read that many rows at a time, never whole."""
    if dtype in _CODECS:
        return _CODECS[dtype](arr, chunk_rows)
    if dtype not in _FLAT:
        raise CmfError(f"no encoder for dtype {dtype!r}")
    enc = _FLAT[dtype]
    if not chunk_rows or not arr.shape:
        return [enc(np.asarray(arr, dtype=np.float32))]
    return (enc(np.asarray(arr[r0:r0 + chunk_rows], dtype=np.float32))
            for r0 in range(0, arr.shape[0], chunk_rows))


def _pieces(data):
    """A payload as an iterable of contiguous byte views."""
    if isinstance(data, np.ndarray):
        return [np.ascontiguousarray(data).reshape(-1).view(np.uint8)]
    try:
        return [memoryview(data).cast("B")]
    except TypeError:
        return (np.ascontiguousarray(p).reshape(-1).view(np.uint8) if isinstance(p, np.ndarray)
                else memoryview(p).cast("B") for p in data)


class CmfWriter:
    """`with CmfWriter(path, header) as w: w.add(...)`: the file appears on a clean exit only.

    `reserve`: bytes kept before the blob for header and directory (moved if they outgrow it)."""

    def __init__(self, path, header: dict | None = None, reserve: int = 1 << 20):
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self._header = dict(header or {})
        self._vocab: bytes | None = None
        self._records: list[tuple[bytes, int, tuple[int, ...], int, int, int]] = []
        self._names: set[str] = set()
        self._features = L.TENSOR_DIR
        self._data_off = L.round_up(L.ENVELOPE_SIZE + reserve, L.DATA_ALIGN)
        self._end = 0  # blob bytes in use
        self._f = open(self._tmp, "w+b")

    def set_header(self, header: dict) -> None:
        """The header JSON's content; "format" and "version" are filled in by the writer."""
        self._header = dict(header)

    def set_vocab(self, data: bytes | None) -> None:
        """The vocab section: a Hugging Face tokenizer.json, verbatim (None: no section)."""
        self._vocab = None if data is None else bytes(data)

    def add(self, name: str, dtype, shape, data) -> None:
        """Append one tensor; `data` is its payload: bytes-like or an iterable of such pieces."""
        self._check_open()
        key, did, shape = self._check_entry(name, dtype, shape)
        want = L.payload_nbytes(did, shape)
        if want is None:
            raise CmfError(f"tensor {name!r}: cannot write dtype {L.DTYPE_NAMES[did]} "
                           "(its payload size is not defined here)")
        off = L.round_up(self._end, L.align_of(want))
        self._f.seek(self._data_off + off)
        h, got = Hash64(), 0
        try:
            for piece in _pieces(data):
                self._f.write(piece)
                h.update(piece)
                got += len(piece)
            if got != want:
                raise CmfError(f"tensor {name!r}: payload of {got} bytes, {L.DTYPE_NAMES[did]} "
                               f"{shape} needs {want}")
        except BaseException:
            # Drop the partial payload; the writer stays usable (the caller may abort).
            self._f.truncate(self._data_off + self._end)
            raise
        self._records.append((key, did, shape, off, got, h.digest()))
        self._names.add(name)
        self._end = off + got
        if did in (L.Q8_2F, L.DTYPE_IDS["vbit"]):
            self._features |= L.QUANT_2F

    def add_array(self, name: str, arr, dtype: str = "f32") -> None:
        """Encode the float array `arr` to `dtype` (f32, f16, bf16, q4tp, q8_2f) and add it."""
        if dtype not in _FLAT and dtype not in _CODECS:
            raise CmfError(f"tensor {name!r}: no encoder for dtype {dtype!r}")
        self.add(name, dtype, arr.shape, encode_iter(arr, dtype))

    def _check_entry(self, name, dtype, shape):
        if name in self._names:
            raise CmfError(f"tensor {name!r} added twice")
        key = str(name).encode("utf-8")
        if not key or len(key) > 0xFFFF:
            raise CmfError(f"tensor name {name!r}: length must be 1..65535 bytes")
        shape = tuple(int(d) for d in shape)
        if len(shape) > L.MAX_NDIM or any(not 0 <= d < 1 << 32 for d in shape):
            raise CmfError(f"tensor {name!r}: shape {shape} (at most 6 dims, each a u32)")
        return key, L.dtype_id(dtype), shape

    def _check_open(self) -> None:
        if self._f is None:
            raise CmfError(f"{self.path}: writer already finished or aborted")

    def _directory(self) -> bytes:
        recs = np.zeros(len(self._records), dtype=L.DIR_RECORD)
        pool, pos = [], 0
        for i, (key, did, shape, off, n, h) in enumerate(self._records):
            recs[i]["name_off"], recs[i]["name_len"] = pos, len(key)
            recs[i]["dtype"], recs[i]["ndim"] = did, len(shape)
            recs[i]["shape"][:len(shape)] = shape
            recs[i]["off"], recs[i]["nbytes"], recs[i]["hash"] = off, n, h
            pool.append(key)
            pos += len(key)
        head = L.DIR_HEAD.pack(len(self._records), L.DIR_HEAD.size + recs.nbytes)
        return head + recs.tobytes() + b"".join(pool)

    def _header_bytes(self) -> bytes:
        doc = {"format": "cmf", "version": L.VERSION}
        doc.update((k, v) for k, v in self._header.items() if k not in doc)
        try:
            return json.dumps(doc, ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise CmfError(f"{self.path}: header is not JSON-serialisable: {e}") from None

    def _move_blob(self, dst: int) -> None:
        """Move the blob [data_off, data_off + end) to start at `dst` (overlap-safe)."""
        src, n, f = self._data_off, self._end, self._f
        starts = range(0, n, _COPY_CHUNK)
        for s in (starts if dst < src else reversed(starts)):
            f.seek(src + s)
            piece = f.read(min(_COPY_CHUNK, n - s))
            f.seek(dst + s)
            f.write(piece)
        self._data_off = dst

    def finish(self) -> Path:
        """Write header, directory, vocab and envelope; rename into place; return the path."""
        self._check_open()
        try:
            header, directory = self._header_bytes(), self._directory()
            need = L.round_up(L.ENVELOPE_SIZE + len(header) + len(directory), L.DATA_ALIGN)
            if need > self._data_off or (need < self._data_off and self._end <= _COMPACT_LIMIT):
                self._move_blob(need)
            f, end = self._f, self._data_off + self._end
            f.truncate(end)
            vocab_off = L.round_up(end, L.SMALL_ALIGN) if self._vocab is not None else 0
            if self._vocab is not None:
                f.seek(vocab_off)
                f.write(self._vocab)
                end = vocab_off + len(self._vocab)
            f.seek(L.ENVELOPE_SIZE)
            f.write(header + directory)
            hdr_end = L.ENVELOPE_SIZE + len(header) + len(directory)
            f.write(b"\0" * (self._data_off - hdr_end))
            f.seek(0)
            f.write(L.ENVELOPE.pack(
                L.MAGIC, L.VERSION, 0, self._features,
                L.ENVELOPE_SIZE, len(header), L.ENVELOPE_SIZE + len(header), len(directory),
                self._data_off, self._end, 0, 0,
                vocab_off, len(self._vocab or b""), 0, 0, hash64(header), hash64(directory)))
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
            f.close()
            self._f = None
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Drop the temporary file; the target path is left as it was."""
        if self._f is not None:
            self._f.close()
            self._f = None
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> "CmfWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()
