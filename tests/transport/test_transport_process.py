"""ReceiverProcess: a receiver in a child process, results and errors back to the parent."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from prfaas.transport import KVSender, PeerAborted, SenderConfig
from prfaas.transport.process import ReceiverProcess, digest_arrays


def test_child_receiver_reports_digest_and_typed_errors() -> None:
    arrays = [(layer, "kv", np.full((64, 32), layer, np.float32)) for layer in range(3)]

    async def send() -> None:
        async with KVSender("127.0.0.1", rx.port, SenderConfig(num_connections=3)) as tx:
            for layer, name, a in arrays:
                await tx.send_array(1, layer, "gqa", name, a)
            await tx.finish(1)
            await tx.send_array(2, 0, "gqa", "kv", arrays[0][2])
            await tx.abort(2, "cancelled by client")

    with ReceiverProcess() as rx:
        rx.expect(1, timeout_s=10)
        asyncio.run(asyncio.wait_for(send(), 20))
        done = rx.result(timeout_s=10)
        assert (done.request_id, done.num_bytes) == (1, 3 * 64 * 32 * 4)
        assert done.digest == digest_arrays(arrays)
        assert done.digest != digest_arrays(arrays[:2])
        assert done.first_byte_s <= done.complete_s
        rx.expect(2, timeout_s=10)
        with pytest.raises(PeerAborted, match="cancelled by client"):
            rx.result(timeout_s=10)
