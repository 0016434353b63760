"""KV transport over mutual TLS 1.3: exact content, and the receiver refusing a plaintext
client, a client with a certificate from another CA, one with no certificate, and a member
that is not an accepted sender; each refusal is counted and logged with the peer's address."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable
from typing import Any

import numpy as np
import pytest
from security_helpers import Certs

from prfaas.core.errors import TransportError
from prfaas.security.tls import Identity
from prfaas.transport import KVReceiver, KVSender, SenderConfig
from prfaas.transport.errors import BadHeader
from prfaas.transport.wire import HEADER_BYTES, DType, EndInfo, Kind, data_header, end_frame


def run(coro: Awaitable[Any], timeout_s: float = 30.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def _receiver(certs: Certs) -> KVReceiver:
    ident = Identity.load(certs.dir, "pdd-0")
    return KVReceiver(tls=ident.server_context(),
                      accept_peer=lambda name: name in {"prfaas-0", "pdp-0"})


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_tls_round_trip_is_exact_and_carries_the_manifest(certs: Certs, compression: str
                                                         ) -> None:
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((513, 64)).astype(np.float16) for _ in range(3)]

    async def body() -> None:
        rx = _receiver(certs)
        async with rx:
            tls = Identity.load(certs.dir, "prfaas-0").client_context()
            cfg = SenderConfig(num_connections=3, chunk_bytes=16 * 1024,
                               compression=compression)
            async with KVSender("127.0.0.1", rx.port, cfg, tls=tls, server_name="pdd-0") as tx:
                for i, a in enumerate(arrays):
                    await tx.send_array(7, i, "mla", "kv_c", a)
                await tx.finish(7, manifest=b"bound")
            kv = await rx.wait_request(7, timeout_s=10)
        for i, a in enumerate(arrays):
            assert kv.layers[i]["kv_c"].tobytes() == a.tobytes()
        assert kv.manifest == b"bound"
        assert rx.stats.tls_refused == 0 and rx.stats.connections_failed == 0
        # compressed frames over TLS carry no payload CRC either; the AEAD covers them
        assert (rx.stats.compressed_frames > 0) == (compression == "zstd")

    run(body())


def _plaintext_client(port: int) -> bytes:
    """A well-formed v2 frame, but no TLS: what an unauthenticated injector would send."""
    payload = np.zeros(64, np.uint8).data
    frame = data_header(1, 0, Kind.MLA, "kv_c", DType.UINT8, (64,), 64, 0, payload) + bytes(64)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(frame + end_frame(1, EndInfo(1, 64, 1, 0)))
        try:
            return s.recv(4096)  # the server's TLS alert (or nothing) before it hangs up
        except OSError:
            return b""


def _tls_client(port: int, ca: str, cert: tuple[str, str] | None, name: str = "pdd-0") -> str:
    """Handshake and try to send; returns how it ended (TLS 1.3 clients learn of a refused
    certificate only when they next read)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(ca)
    if cert is not None:
        ctx.load_cert_chain(*cert)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname=name) as s:
                s.sendall(b"\0" * HEADER_BYTES)
                return f"read {s.recv(1)!r}"
        except (ssl.SSLError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("client", ["plaintext", "foreign_ca", "no_certificate",
                                    "unaccepted_member"])
def test_receiver_refuses_unauthenticated_peers(certs: Certs, client: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    d, f = certs.dir, certs.foreign

    async def body() -> tuple[str, KVReceiver]:
        rx = _receiver(certs)
        async with rx:
            loop = asyncio.get_running_loop()
            if client == "plaintext":
                outcome = repr(await loop.run_in_executor(None, _plaintext_client, rx.port))
            elif client == "foreign_ca":  # trusts our CA, shows a cert the other CA signed
                outcome = await loop.run_in_executor(None, _tls_client, rx.port, str(d / "ca.pem"),
                                                     (str(f / "prfaas-0.pem"),
                                                      str(f / "prfaas-0.key")))
            elif client == "no_certificate":
                outcome = await loop.run_in_executor(None, _tls_client, rx.port,
                                                     str(d / "ca.pem"), None)
            else:  # a certificate of this CA, but not one of the prefill workers
                outcome = await loop.run_in_executor(None, _tls_client, rx.port,
                                                     str(d / "ca.pem"),
                                                     (str(d / "stranger.pem"),
                                                      str(d / "stranger.key")))
            for _ in range(200):  # the refusal is counted once the server side has run
                if rx.stats.tls_refused:
                    break
                await asyncio.sleep(0.02)
            with pytest.raises(Exception, match="timed out"):
                await rx.wait_request(1, timeout_s=0.2)  # nothing was admitted
        return outcome, rx

    with caplog.at_level(logging.WARNING, logger="prfaas.transport"):
        outcome, rx = run(body())
    assert rx.stats.tls_refused == 1, outcome
    assert rx.stats.received_frames == 0
    assert "read b'\\x00'" not in outcome  # the client never got an answer to its bytes
    refusal = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refusal and "127.0.0.1:" in refusal[0]
    if client == "unaccepted_member":
        assert "'stranger'" in refusal[0]


def test_plaintext_frame_without_payload_checksum_is_refused() -> None:
    async def body() -> KVReceiver:
        rx = KVReceiver()
        async with rx:
            payload = np.zeros(64, np.uint8).data
            frame = data_header(1, 0, Kind.MLA, "kv_c", DType.UINT8, (64,), 64, 0, payload,
                                with_checksum=False)
            _r, w = await asyncio.open_connection("127.0.0.1", rx.port)
            w.write(frame + bytes(64))
            await w.drain()
            for _ in range(200):
                if rx.errors:
                    break
                await asyncio.sleep(0.02)
            w.close()
        return rx

    rx = run(body())
    assert isinstance(rx.errors[0], BadHeader)
    assert "no payload checksum on a plaintext connection" in str(rx.errors[0])


def test_request_failed_mid_transfer_drops_in_flight_chunks_and_links_stay_up() -> None:
    """A request failed while chunks of it are still arriving on other connections (here by
    a consumer callback) must not break those connections: the next request gets through."""
    calls: list[int] = []

    def on_tensor(rid: int, _layer: int, _name: str, _a: np.ndarray) -> None:
        calls.append(rid)
        if rid == 1:
            raise RuntimeError("consumer refuses request 1")

    big = np.arange(6 << 20, dtype=np.uint8)

    async def body() -> None:
        async with KVReceiver(on_tensor=on_tensor) as rx:
            cfg = SenderConfig(num_connections=4, chunk_bytes=256 << 10)
            async with KVSender("127.0.0.1", rx.port, cfg) as tx:
                for layer in range(4):
                    await tx.send_array(1, layer, "mla", "kv_c", big)
                await tx.finish(1)
                with pytest.raises(Exception, match="on_tensor callback raised"):
                    await rx.wait_request(1, timeout_s=20)
                await tx.send_array(2, 0, "mla", "kv_c", big)
                await tx.finish(2)
                kv = await rx.wait_request(2, timeout_s=20)
            assert kv.layers[0]["kv_c"].tobytes() == big.tobytes()
            assert rx.stats.connections_failed == 0, rx.errors

    run(body())


async def _flipping_proxy(target_port: int, flip_at: int | None) -> asyncio.Server:
    """A TCP relay to `target_port` that flips one bit of the client's stream at byte
    `flip_at` (None: relays faithfully, the control)."""
    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, flip: int | None
                   ) -> None:
        seen = 0
        try:
            while data := await src.read(65536):
                if flip is not None and seen <= flip < seen + len(data):
                    changed = bytearray(data)
                    changed[flip - seen] ^= 0x01
                    data = bytes(changed)
                seen += len(data)
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer, flip_at), pipe(up_reader, writer, None))

    return await asyncio.start_server(relay, "127.0.0.1", 0)


@pytest.mark.parametrize("flip", [False, True])
def test_tls_data_frames_carry_no_crc_yet_a_flipped_ciphertext_bit_fails_the_request(
        certs: Certs, flip: bool) -> None:
    """Over TLS the sender leaves the payload CRC off (wire.py: the record's AEAD tag covers
    every byte); one bit flipped on the wire inside a 256 KiB DATA payload (received by the
    payload thread) must still fail the request. Control: the same relay, no flip, exact bytes."""
    payload = np.random.default_rng(5).integers(0, 256, 512 * 1024, dtype=np.uint8)

    async def body() -> None:
        async with _receiver(certs) as rx:
            relay = await _flipping_proxy(rx.port, 300_000 if flip else None)
            port = relay.sockets[0].getsockname()[1]
            tls = Identity.load(certs.dir, "prfaas-0").client_context()
            cfg = SenderConfig(num_connections=1, chunk_bytes=256 * 1024)
            with contextlib.suppress(TransportError):  # the receiver may hang up first
                async with KVSender("127.0.0.1", port, cfg, tls=tls, server_name="pdd-0") as tx:
                    await tx.send_array(9, 0, "mla", "kv_c", payload)
                    await tx.finish(9)
            if flip:
                with pytest.raises(TransportError, match="TLS record from peer"):
                    await rx.wait_request(9, timeout_s=10)
            else:
                kv = await rx.wait_request(9, timeout_s=10)
                assert kv.layers[0]["kv_c"].tobytes() == payload.tobytes()
            relay.close()

    run(body())
