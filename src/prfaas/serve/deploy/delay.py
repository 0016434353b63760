"""A user-space delay stage on the inter-DC link (netem is not available on these kernels).

`python -m prfaas.serve.deploy.delay --listen IP --ports P,... --target IP --control FILE` runs
inside the PrfaaS namespace (the launcher starts it with `link.delay_stage: true`): it listens
on IP:P for each decoder KV port P and relays every connection to TARGET:P across the shaped
veth, holding each chunk `delay_ms / 2` in each direction, so a request/response exchange
sees `delay_ms` more round trip. The delay is read from FILE (a number of ms; 0 when missing)
every 50 ms, so a fault can add RTT for a window. Order within a connection is kept; a queue
of at most 256 chunks per direction bounds memory. Limits: TCP's own window dynamics over a
long RTT are not reproduced (the relay terminates TCP), only the added latency per chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path

CHUNK_BYTES = 64 * 1024
QUEUE_CHUNKS = 256
POLL_S = 0.05


class DelayStage:
    def __init__(self, control: Path) -> None:
        self.control = control
        self.delay_s = 0.0

    async def watch(self) -> None:
        while True:
            try:
                self.delay_s = max(float(self.control.read_text().strip() or 0), 0.0) / 1e3
            except (OSError, ValueError):
                self.delay_s = 0.0
            await asyncio.sleep(POLL_S)

    async def relay(self, target: tuple[str, int], reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer),
                             return_exceptions=True)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)

        async def read() -> None:
            while chunk := await src.read(CHUNK_BYTES):
                await queue.put((time.monotonic() + self.delay_s / 2, chunk))
            await queue.put((0.0, b""))

        reading = asyncio.create_task(read())
        try:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                await asyncio.sleep(max(due - time.monotonic(), 0.0))
                dst.write(chunk)
                await dst.drain()
        finally:
            reading.cancel()
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()


async def serve(listen: str, ports: list[int], target: str, control: Path,
                ready: Path | None) -> None:
    stage = DelayStage(control)
    servers = []
    for port in ports:
        def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, p: int = port
                    ) -> asyncio.Future[None]:
            return asyncio.ensure_future(stage.relay((target, p), r, w))

        servers.append(await asyncio.start_server(handler, listen, port))
    if ready is not None:
        ready.write_text("ready\n")
    await stage.watch()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--ports", required=True, help="comma-separated")
    parser.add_argument("--target", required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--ready", default=None)
    args = parser.parse_args(argv)
    try:
        ports = [int(p) for p in args.ports.split(",") if p]
    except ValueError:
        print(f"delay: --ports={args.ports!r}: must be comma-separated integers",
              file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, ports, args.target, Path(args.control),
                          Path(args.ready) if args.ready else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
