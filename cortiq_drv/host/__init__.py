"""The numpy host arm: the Qwen3.5-family hybrid on the CPU (docs/MODEL.md), the reference the
kernels are tested against and the fallback without a GPU."""

from cortiq_drv.host.model import HostModel, HostRows
from cortiq_drv.host.sequence import Sequence

__all__ = ["HostModel", "HostRows", "Sequence"]
