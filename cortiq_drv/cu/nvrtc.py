"""NVRTC compile to CUBIN with a content-addressed disk cache, module load and kernel lookup
(the reference's `compile` / `func`).

CUBIN, not PTX: it loads in ~0.2 ms where a PTX JIT takes ~100 ms, and PTX from a newer NVRTC may
carry an ISA the driver cannot JIT (docs/CUDA_PYTHON.md). Compiling needs no GPU.

Cache key: sha256 of the source, the sorted options (defines and arch included), the NVRTC
version and the arch; files are written to a temp name and renamed, so concurrent compilers never
see a torn CUBIN. The directory is `knobs.get().kernel_cache`, created on the first write.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from cortiq_drv import knobs
from cortiq_drv.atomic import write_atomic
from cortiq_drv.cu import driver
from cortiq_drv.cu.buf import Buf
from cortiq_drv.errors import NvrtcError

# Options every compile gets besides the arch and the defines.
BASE_OPTIONS = ("--std=c++17",)
_ELF = b"\x7fELF"
# CUBINs this process has read or written, by cache file: a kernel cache moved by the knobs is
# filled anew
_memo: dict[Path, bytes] = {}


def _nvrtc():
    """The NVRTC bindings module; NvrtcError when the library cannot be loaded."""
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as e:  # noqa: BLE001 - pathfinder / dlopen failures vary by version
        raise NvrtcError(f"NVRTC cannot be loaded: {type(e).__name__}: {e}") from e
    return nvrtc


def _ok(nv, out, call: str):
    err = out[0]
    if err != nv.nvrtcResult.NVRTC_SUCCESS:
        name = nv.nvrtcGetErrorString(err)[1]
        raise NvrtcError(f"{call}: {name.decode() if name else err}")
    return out[1] if len(out) == 2 else None


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def ptxas_report(log: str) -> list[tuple[str, int, int, int, int, int]]:
    """(kernel, registers, stack, spill stores, spill loads, static shared memory bytes) per entry
    of a compile log made with -Xptxas=-v."""
    rows, name, spill = [], None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            name, spill = m.group(1), (0, 0, 0)
        elif m := _SPILL.search(line):
            spill = tuple(int(v) for v in m.groups())
        elif (m := _REGS.search(line)) and name:
            smem = _SMEM.search(line)
            rows.append((name, int(m.group(1)), *spill, int(smem.group(1)) if smem else 0))
            name = None
    return rows


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the loaded NVRTC; raises NvrtcError when there is none."""
    nv = _nvrtc()
    err, major, minor = nv.nvrtcVersion()
    _ok(nv, (err,), "nvrtcVersion")
    return int(major), int(minor)


def options_for(defines, arch: str, extra=()) -> list[str]:
    """The option list: arch, base options, `-DNAME=VALUE` per define, `extra` (e.g. -Xptxas=-v).

    `defines` is a mapping name -> value (None: a bare `-DNAME`) or an iterable of "NAME=VALUE"."""
    if isinstance(defines, dict):
        defs = [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines.items()]
    else:
        defs = [f"-D{d}" for d in defines]
    return [f"--gpu-architecture={arch}", *BASE_OPTIONS, *defs, *extra]


def cache_key(src: str, options, version: tuple[int, int], arch: str) -> str:
    """Content address of a compile: same inputs give the same key, any change a new one."""
    blob = json.dumps({"src": src, "options": sorted(options), "nvrtc": list(version),
                       "arch": arch}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def compile_program(src: str, options, name: str = "cortiq.cu", ptx: bool = False) -> tuple[bytes, str]:
    """Compile uncached: (CUBIN, log), or with `ptx` (PTX text, log) of the same compile (a real
    arch such as sm_90 emits both). A failed compile raises NvrtcError carrying the log."""
    nv = _nvrtc()
    prog = _ok(nv, nv.nvrtcCreateProgram(src.encode(), name.encode(), 0, [], []),
               "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        err = nv.nvrtcCompileProgram(prog, len(opts), opts)[0]
        size = _ok(nv, nv.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        # A fresh writable buffer: NVRTC writes into it, and `b" " * 1` would be CPython's shared
        # one-byte bytes object (writing there corrupts every b" " in the process).
        log = bytearray(size)
        _ok(nv, nv.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        log_text = bytes(log).rstrip(b"\0 ").decode(errors="replace")
        if err != nv.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"nvrtcCompileProgram {name} ({' '.join(options)}): "
                             f"{nv.nvrtcGetErrorString(err)[1].decode()}", log_text)
        if ptx:
            size = _ok(nv, nv.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            text = bytearray(size)
            _ok(nv, nv.nvrtcGetPTX(prog, text), "nvrtcGetPTX")
            return bytes(text).rstrip(b"\0"), log_text
        size = _ok(nv, nv.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        _ok(nv, nv.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return bytes(cubin), log_text
    finally:
        nv.nvrtcDestroyProgram(prog)


def _cached(src: str, defines, arch: str, extra) -> tuple[list[str], Path]:
    """A compile's options and the file the kernel cache keeps its CUBIN in (its content address)."""
    options = options_for(defines, arch, extra)
    return options, knobs.get().kernel_cache / f"{cache_key(src, options, nvrtc_version(), arch)}.cubin"


def cubin_path(src: str, defines=(), arch: str = "sm_90", extra=()) -> Path:
    """Where `compile_cubin` keeps (or would keep) this compile's CUBIN."""
    return _cached(src, defines, arch, extra)[1]


def compile_cubin(src: str, defines=(), arch: str = "sm_90", extra=()) -> bytes:
    """CUBIN for `src` on `arch`, from the disk cache when this exact compile ran before."""
    options, path = _cached(src, defines, arch, extra)
    hit = _memo.get(path)
    if hit is not None:
        return hit
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    if not data.startswith(_ELF):
        data, _ = compile_program(src, options)
        write_atomic(path, data)
    _memo[path] = data
    return data


class Func:
    """A kernel entry point; `smem_ok` is the dynamic shared memory it may launch with now; `pdl`
    marks a kernel that starts with `pdl_begin()` (kernels/common.cuh), which `Ctx.launch` then
    launches as a programmatic dependent of the kernel before it (CORTIQ_DRV_PDL=0: never)."""

    __slots__ = ("handle", "name", "smem_ok", "pdl")

    def __init__(self, handle, name: str):
        self.handle = handle
        self.name = name
        self.smem_ok = 48 * 1024
        self.pdl = False

    def allow_smem(self, nbytes: int) -> None:
        """Opt in to `nbytes` of dynamic shared memory (above 48 KiB needs the attribute)."""
        driver.func_set_max_dyn_smem(self.handle, nbytes, self.name)
        self.smem_ok = nbytes

    def attr(self, name: str) -> int:
        """An integer attribute by short name: "NUM_REGS", "LOCAL_SIZE_BYTES", ..."""
        return driver.func_attr(self.handle, name)


class Module:
    """A loaded CUBIN; its functions live until `close()`."""

    def __init__(self, ctx, cubin: bytes):
        self.ctx = ctx
        self.handle = driver.module_load_data(cubin)
        self._funcs: dict[str, Func] = {}

    def func(self, name: str) -> Func:
        f = self._funcs.get(name)
        if f is None:
            f = self._funcs[name] = Func(driver.module_get_function(self.handle, name), name)
        return f

    def symbol(self, name: str) -> Buf:
        """The `__device__` variable `name`, as a non-owning Buf (valid while the module is)."""
        return Buf(self.ctx, *driver.module_get_global(self.handle, name), False)

    def close(self) -> None:
        if self.handle is not None:
            driver.module_unload(self.handle)
            self.handle = None
            self._funcs.clear()


def load(ctx, cubin: bytes) -> Module:
    """Load a CUBIN into the context."""
    return Module(ctx, cubin)


def func(module: Module, name: str) -> Func:
    """The `extern "C"` kernel `name` of `module`."""
    return module.func(name)
