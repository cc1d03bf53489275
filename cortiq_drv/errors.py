"""The project's exceptions: one root, one class per failing layer."""


class CortiqError(Exception):
    """Root of every error this package raises on purpose."""


class NoDevice(CortiqError):
    """There is no usable CUDA driver or device on this machine."""


class CudaError(CortiqError):
    """A CUDA driver call returned an error: `call`, the CUresult `name` and the key arguments."""

    def __init__(self, call: str, name: str, args: str = ""):
        self.call = call
        self.name = name
        self.args_text = args
        super().__init__(f"{call}: {name}" + (f" ({args})" if args else ""))


class NvrtcError(CortiqError):
    """An NVRTC call or compile failed; `log` holds the compiler's log."""

    def __init__(self, message: str, log: str = ""):
        self.log = log
        super().__init__(message + (f"\n{log}" if log else ""))


class CublasError(CortiqError):
    """A cuBLAS call returned a status other than success; `status` is its name."""

    def __init__(self, call: str, status: str, args: str = ""):
        self.call = call
        self.status = status
        super().__init__(f"{call}: {status}" + (f" ({args})" if args else ""))


class CmfError(CortiqError):
    """A CMF file is malformed, unsupported, or fails a hash check."""


class ConvertError(CortiqError):
    """A checkpoint cannot be converted; the message names the tensor or key."""


class Declined(CortiqError):
    """An arm refuses a request it cannot serve (the reference's `decline`); `reason` says why.

    The caller can act on it (fall back to another arm, shorten the request)."""

    def __init__(self, what: str, reason: str):
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: declined: {reason}")
