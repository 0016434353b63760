"""Layer streaming: send each layer's KV while the next layer computes.

`stream_prefill` runs a blocking compute function (a torch prefill: torch releases the GIL) in
a worker thread and hands it a `LayerSink`; every call of the sink moves that layer's arrays to
the event loop thread-safely (call_soon_threadsafe), where they are queued on the KVSender at
once. When the compute returns, END follows; if it raises, the request is aborted on the wire
with the reason and the exception propagates. Torch-free: the caller converts its layer type
to (name, array) pairs (for the engine: `prfaas.engine.wire_adapter.layer_kv_to_arrays`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from prfaas.transport.sender import KVSender

_T = TypeVar("_T")
# (layer index, kind name, [(tensor name, array)]): called from the compute thread.
LayerSink = Callable[[int, str, list[tuple[str, np.ndarray]]], None]
_Item = tuple[int, str, list[tuple[str, np.ndarray]]] | None


async def stream_prefill(sender: KVSender, request_id: int,
                         compute: Callable[[LayerSink], _T]) -> _T:
    """Run `compute(sink)` in a thread, streaming each layer it emits; returns its result."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[_Item] = asyncio.Queue()

    def sink(layer: int, kind: str, arrays: list[tuple[str, np.ndarray]]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (layer, kind, arrays))

    done = loop.run_in_executor(None, compute, sink)
    # The future completes through call_soon_threadsafe too, after every sink call the compute
    # made, so the sentinel lands behind the last layer.
    done.add_done_callback(lambda _f: queue.put_nowait(None))
    try:
        while (item := await queue.get()) is not None:
            layer, kind, arrays = item
            for name, array in arrays:
                await sender.send_array(request_id, layer, kind, name, array)
    except BaseException:
        # The thread cannot be cancelled; let it finish on its own, its outcome retrieved so
        # asyncio does not report it as lost, and surface the transport error now.
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise
    try:
        result = await done
    except Exception as exc:
        await sender.abort(request_id, f"prefill failed: {type(exc).__name__}: {exc}")
        raise
    await sender.finish(request_id)
    return result
