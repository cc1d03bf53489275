"""The driver layer: the reference's `Ctx`, `Buf`, plan arena, `kargs!`, `capture`, `GraphRec`.

Importing this package touches no driver; `Ctx.current()` is the first driver call.
"""

from cortiq_drv.cu.args import KArgs, kargs
from cortiq_drv.cu.buf import Arena, Buf, Pinned
from cortiq_drv.cu.ctx import Ctx, device_available
from cortiq_drv.cu.graph import Event, Graph, GraphRec, capture

__all__ = ["Arena", "Buf", "Ctx", "Event", "Graph", "GraphRec", "KArgs", "Pinned", "capture",
           "device_available", "kargs"]
