"""Checked CUDA driver calls: the only module that imports `cuda.bindings.driver`.

Ports the reference's `cu::` call wrappers (`curesult`, `derr`): every call returns
`(CUresult, *outputs)`; `check` unwraps it or raises `CudaError(call, CUresult name, key args)`.
Only the API subset shared by cuda-bindings 12.x and 13.x is used (docs/CUDA_PYTHON.md): no
cuCtxCreate, no `_v2` names, `cuGraphInstantiate(graph, 0)`.

Without a driver the first call (`cuInit`) raises instead of returning an error, with an exception
type that differs by version; `init` turns any such failure into `NoDevice`.
"""

from __future__ import annotations

from cuda.bindings import driver as _d

from cortiq_drv.errors import CudaError, NoDevice

_SUCCESS = _d.CUresult.CUDA_SUCCESS
_ATTR = _d.CUdevice_attribute
_MAX_DYN_SMEM = _d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_FUNC_ATTR = _d.CUfunction_attribute
_THREAD_LOCAL = _d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL


def error_name(err) -> str:
    """`CUDA_ERROR_...` for a CUresult (the enum's own name if the driver cannot say)."""
    try:
        res, s = _d.cuGetErrorName(err)
        if res == _SUCCESS and s:
            return s.decode()
    except Exception:  # noqa: BLE001 - no driver to ask: fall back to the enum
        pass
    return getattr(err, "name", f"CUresult {int(err)}")


def check(out, call: str, args: str = ""):
    """Unwrap `(CUresult, *outputs)`: None, the one output, or the tuple of outputs."""
    err = out[0]
    if err != _SUCCESS:
        raise CudaError(call, error_name(err), args)
    if len(out) == 1:
        return None
    return out[1] if len(out) == 2 else out[1:]


def init() -> None:
    """cuInit(0); a missing driver or device becomes `NoDevice` with the reason."""
    try:
        out = _d.cuInit(0)
    except Exception as e:  # noqa: BLE001 - the exception type differs by bindings version
        raise NoDevice(f"no CUDA driver: {type(e).__name__}: {e}") from e
    if out[0] != _SUCCESS:
        raise NoDevice(f"no CUDA device: cuInit returned {error_name(out[0])}")
    if check(_d.cuDeviceGetCount(), "cuDeviceGetCount") < 1:
        raise NoDevice("no CUDA device: the driver reports 0 devices")


def device_get(ordinal: int):
    return check(_d.cuDeviceGet(ordinal), "cuDeviceGet", f"ordinal={ordinal}")


def device_attr(dev, name: str) -> int:
    """An integer device attribute by its short name, e.g. "MULTIPROCESSOR_COUNT"."""
    return int(check(_d.cuDeviceGetAttribute(getattr(_ATTR, "CU_DEVICE_ATTRIBUTE_" + name), dev),
                     "cuDeviceGetAttribute", name))


def primary_ctx_retain(dev):
    return check(_d.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")


def primary_ctx_release(dev) -> None:
    check(_d.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")


def ctx_set_current(ctx) -> None:
    check(_d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def mem_alloc(nbytes: int) -> int:
    return int(check(_d.cuMemAlloc(nbytes), "cuMemAlloc", f"bytes={nbytes}"))


def mem_free(ptr: int) -> None:
    check(_d.cuMemFree(ptr), "cuMemFree", f"ptr={ptr:#x}")


def mem_get_info() -> tuple[int, int]:
    free, total = check(_d.cuMemGetInfo(), "cuMemGetInfo")
    return int(free), int(total)


def mem_alloc_host(nbytes: int) -> int:
    """Page-locked host memory (inputs a graph re-reads from a fixed address)."""
    return int(check(_d.cuMemAllocHost(nbytes), "cuMemAllocHost", f"bytes={nbytes}"))


def mem_free_host(ptr: int) -> None:
    check(_d.cuMemFreeHost(ptr), "cuMemFreeHost", f"ptr={ptr:#x}")


def memset_d8_async(ptr: int, byte: int, nbytes: int, stream) -> None:
    check(_d.cuMemsetD8Async(ptr, byte, nbytes, stream), "cuMemsetD8Async",
          f"ptr={ptr:#x}, byte={byte}, bytes={nbytes}")


def memcpy_htod_async(dst: int, src_host: int, nbytes: int, stream) -> None:
    check(_d.cuMemcpyHtoDAsync(dst, src_host, nbytes, stream), "cuMemcpyHtoDAsync",
          f"dst={dst:#x}, bytes={nbytes}")


def memcpy_dtoh_async(dst_host: int, src: int, nbytes: int, stream) -> None:
    check(_d.cuMemcpyDtoHAsync(dst_host, src, nbytes, stream), "cuMemcpyDtoHAsync",
          f"src={src:#x}, bytes={nbytes}")


def memcpy_dtod_async(dst: int, src: int, nbytes: int, stream) -> None:
    check(_d.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync",
          f"dst={dst:#x}, src={src:#x}, bytes={nbytes}")


def stream_create_nonblocking():
    flags = _d.CUstream_flags.CU_STREAM_NON_BLOCKING
    return check(_d.cuStreamCreate(flags), "cuStreamCreate")


def stream_sync(stream) -> None:
    check(_d.cuStreamSynchronize(stream), "cuStreamSynchronize")


def stream_destroy(stream) -> None:
    check(_d.cuStreamDestroy(stream), "cuStreamDestroy")


def module_load_data(image: bytes):
    return check(_d.cuModuleLoadData(image), "cuModuleLoadData", f"image bytes={len(image)}")


def module_unload(module) -> None:
    check(_d.cuModuleUnload(module), "cuModuleUnload")


def module_get_function(module, name: str):
    return check(_d.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction", name)


def module_get_global(module, name: str) -> tuple[int, int]:
    """(device address, bytes) of the module's `__device__` variable `name`."""
    ptr, nbytes = check(_d.cuModuleGetGlobal(module, name.encode()), "cuModuleGetGlobal", name)
    return int(ptr), int(nbytes)


def func_set_max_dyn_smem(func, nbytes: int, name: str = "") -> None:
    check(_d.cuFuncSetAttribute(func, _MAX_DYN_SMEM, nbytes), "cuFuncSetAttribute",
          f"{name} MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}")


def func_attr(func, name: str) -> int:
    """An integer function attribute by short name, e.g. "NUM_REGS"."""
    attr = getattr(_FUNC_ATTR, "CU_FUNC_ATTRIBUTE_" + name)
    return int(check(_d.cuFuncGetAttribute(attr, func), "cuFuncGetAttribute", name))


def launch_kernel(func, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                  stream, params: int, name: str = "") -> None:
    """cuLaunchKernel with `params` the address of a packed `void*[n]` (args.KArgs.addr)."""
    err = _d.cuLaunchKernel(func, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                            smem, stream, params, 0)[0]
    if err != _SUCCESS:
        raise CudaError("cuLaunchKernel", error_name(err),
                        f"{name} grid={grid} block={block} smem={smem}")


def _pdl_attrs():
    """The launch attribute list of a programmatic dependent launch, made once."""
    global _PDL_ATTRS
    if _PDL_ATTRS is None:
        attr = _d.CUlaunchAttribute()
        attr.id = _d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        _PDL_ATTRS = [attr]
    return _PDL_ATTRS


_PDL_ATTRS = None
# Programmatic launch configurations by (grid, block, shared memory, stream handle): the driver
# reads a configuration at the call, so one object serves every launch of its shape (making one
# costs more Python than the launch itself). Cleared when it reaches _PDL_CFGS_MAX shapes.
_PDL_CFGS: dict = {}
_PDL_CFGS_MAX = 4096


def _pdl_config(grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream):
    """The launch configuration of a programmatic launch of this shape on `stream`."""
    key = (grid, block, smem, 0 if stream is None else int(stream))
    cfg = _PDL_CFGS.get(key)
    if cfg is None:
        if len(_PDL_CFGS) >= _PDL_CFGS_MAX:
            _PDL_CFGS.clear()
        cfg = _d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes = smem
        cfg.hStream = stream
        cfg.attrs = _pdl_attrs()
        cfg.numAttrs = 1
        _PDL_CFGS[key] = cfg
    return cfg


def launch_kernel_pdl(func, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                      stream, params: int, name: str = "") -> None:
    """`launch_kernel` as a programmatic dependent (cuLaunchKernelEx with programmatic stream
    serialization): the kernel may start before the one ahead of it on the stream has finished,
    and must wait for it itself (griddepcontrol.wait); in a capture, a programmatic graph edge."""
    err = _d.cuLaunchKernelEx(_pdl_config(grid, block, smem, stream), func, params, 0)[0]
    if err != _SUCCESS:
        raise CudaError("cuLaunchKernelEx", error_name(err),
                        f"{name} (programmatic) grid={grid} block={block} smem={smem}")


def begin_capture(stream) -> None:
    check(_d.cuStreamBeginCapture(stream, _THREAD_LOCAL), "cuStreamBeginCapture")


def end_capture(stream):
    return check(_d.cuStreamEndCapture(stream), "cuStreamEndCapture")


def graph_instantiate(graph):
    return check(_d.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")


def graph_destroy(graph) -> None:
    check(_d.cuGraphDestroy(graph), "cuGraphDestroy")


def graph_upload(exec_, stream) -> None:
    check(_d.cuGraphUpload(exec_, stream), "cuGraphUpload")


def graph_launch(exec_, stream) -> None:
    err = _d.cuGraphLaunch(exec_, stream)[0]
    if err != _SUCCESS:
        raise CudaError("cuGraphLaunch", error_name(err))


def graph_exec_destroy(exec_) -> None:
    check(_d.cuGraphExecDestroy(exec_), "cuGraphExecDestroy")


def event_create():
    return check(_d.cuEventCreate(_d.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")


def event_record(event, stream) -> None:
    check(_d.cuEventRecord(event, stream), "cuEventRecord")


def event_sync(event) -> None:
    check(_d.cuEventSynchronize(event), "cuEventSynchronize")


def event_elapsed_ms(start, end) -> float:
    return float(check(_d.cuEventElapsedTime(start, end), "cuEventElapsedTime"))


def event_destroy(event) -> None:
    check(_d.cuEventDestroy(event), "cuEventDestroy")
