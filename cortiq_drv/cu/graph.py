"""Graph capture and replay (the reference's `capture`, `GraphRec`, `cuGraphLaunch`) and events.

Kernel arguments are recorded by value, so a graph replays against the same device addresses:
inputs change by writing new contents into those buffers (pinned host memory for uploads a graph
re-reads). `GraphRec` keeps the pointer signature a graph was recorded with so a caller can tell
whether it still applies.
"""

from __future__ import annotations

from cortiq_drv.cu import driver
from cortiq_drv.errors import CublasError


class Graph:
    """An instantiated graph (CUgraphExec) bound to a context's stream."""

    def __init__(self, ctx, exec_):
        self.ctx = ctx
        self.exec = exec_

    def upload(self) -> None:
        """Pre-load the graph's work onto the device so the first launch costs no more than later ones."""
        driver.graph_upload(self.exec, self.ctx.stream)

    def launch(self) -> None:
        """Replay on the stream (asynchronous)."""
        driver.graph_launch(self.exec, self.ctx.stream)

    def close(self) -> None:
        if self.exec is not None:
            driver.graph_exec_destroy(self.exec)
            self.exec = None


def _blas_before_capture(ctx) -> None:
    """Create the cuBLAS handle now: creating it inside a capture is illegal, and GEMMs in `fn`
    then record. Where there is no cuBLAS, a GEMM inside `fn` raises and names why."""
    try:
        ctx.blas()
    except CublasError:
        pass


def capture(ctx, fn) -> Graph:
    """Record the work `fn()` queues on `ctx.stream` into an instantiated graph.

    Thread-local capture mode: other threads' CUDA calls are not disturbed. The capture is always
    ended, so an exception from `fn` leaves the stream usable (and is the one raised)."""
    _blas_before_capture(ctx)
    driver.begin_capture(ctx.stream)
    ctx.capturing = True
    try:
        fn()
    except BaseException:
        ctx.capturing = False
        try:
            driver.graph_destroy(driver.end_capture(ctx.stream))
        except Exception:  # noqa: BLE001 - fn's error is the one to report
            pass
        raise
    ctx.capturing = False
    graph = driver.end_capture(ctx.stream)
    try:
        exec_ = driver.graph_instantiate(graph)
    finally:
        driver.graph_destroy(graph)
    return Graph(ctx, exec_)


class GraphRec:
    """A replayable call: the instantiated graph and the pointers it was recorded with."""

    def __init__(self, graph: Graph, sig):
        self.graph = graph
        self.sig = tuple(sig)

    def matches(self, sig) -> bool:
        """True when `sig` equals the recorded pointer signature (the graph still applies)."""
        return self.sig == tuple(sig)

    def launch(self) -> None:
        self.graph.launch()

    def close(self) -> None:
        self.graph.close()


class Event:
    """A CUDA event for timing work on the stream."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.handle = driver.event_create()

    def record(self) -> None:
        driver.event_record(self.handle, self.ctx.stream)

    def sync(self) -> None:
        driver.event_sync(self.handle)

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to `end` (both recorded; waits for `end`)."""
        end.sync()
        return driver.event_elapsed_ms(self.handle, end.handle)

    def close(self) -> None:
        if self.handle is not None:
            driver.event_destroy(self.handle)
            self.handle = None
