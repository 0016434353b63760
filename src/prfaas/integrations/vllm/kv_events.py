"""vLLM's KV cache events -> the router's GlobalKVCacheManager (router side; no vLLM import).

With `vllm: {kv_events: true}` every instance runs with `--kv-events-config` (publisher zmq,
bound on the worker's `events_port`, or on a unix socket in `vllm.events_dir`, the only way
beside TLS; topic = the worker's name), and the router subscribes to each (one ZMQ SUB socket
per instance). A message is (topic, 8-byte big-endian sequence number,
msgpack KVEventBatch [ts, events, dp_rank]); each event a map tagged `type`: BlockStored
(block_hashes, parent_block_hash, token_ids, block_size, group_idx, kv_cache_spec_kind,
extra_keys), BlockRemoved (block_hashes, group_idx) or AllBlocksCleared. They are translated
by `cache.block_events.EngineBlockIndex` (vLLM's block hashes -> our chained hashes, through
the token ids the stored events carry), which reports inserts and evictions to the manager; a
batch is applied whole, since a hybrid model's state groups name blocks that its attention
group's event, later in the batch, places. The topology's `block_size_tokens` must be vLLM's
real block size (vLLM raises a hybrid model's to fit its state page: 256 for vllm-local.yaml's
tiny Qwen3-Next); an event in another size is logged once per instance and counted unplaced.

PUB/SUB drops silently (a slow subscriber past the high-water mark, a reconnect, an instance
restart, which starts its numbering over): the sequence number shows it, and a gap resets that
instance's index, so the router under-counts until new events arrive, never counts a block the
instance no longer holds. Blocks whose identity includes more than the token ids (LoRA,
multimodal inputs, cache_salt: `extra_keys`) cannot be a hit for a plain prompt and are skipped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Hashable, Mapping
from typing import Any

from prfaas.cache.block_events import (
    AllBlocksCleared,
    BlockEvent,
    BlockRemoved,
    BlockStored,
    EngineBlockIndex,
    EventStats,
)
from prfaas.cache.listener import PoolListener
from prfaas.core.errors import ConfigError
from prfaas.serve.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def events_config(endpoint: str, topic: str) -> dict[str, Any]:
    """The instance's `--kv-events-config`, publishing on `endpoint` (`endpoints`' first)."""
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
            "topic": topic}


def endpoints(name: str, host: str, port: int, events_dir: str | None, tls: bool
              ) -> tuple[str, str]:
    """Where worker `name` publishes its events and where the router subscribes to them.
    With `events_dir` (vllm_settings.py): a unix socket in it, `ipc://DIR/NAME.events`, which
    vLLM binds; the folder must be private (`check_private`). Without: TCP, which vLLM binds
    only on a wildcard address (`tcp://*:PORT`, the port open on every interface of the
    instance's host), refused beside TLS (`tls`): fail closed."""
    if events_dir is not None:
        check_private(events_dir)
        path = f"ipc://{os.path.join(events_dir, name)}.events"
        return path, path
    if tls:
        raise ConfigError(f"workers.{name}.kv_events", "tcp",
                          "with security.tls on, vLLM's KV events (ZMQ: no TLS, no "
                          "authentication, prompts' token ids) go only over unix sockets in a "
                          "private vllm.events_dir; `prfaas serve` makes one when every vLLM "
                          "instance runs on the router's host")
    return f"tcp://*:{port}", f"tcp://{host}:{port}"


def check_private(events_dir: str) -> None:
    """Refuse (ConfigError) an events folder another user could read or write: the sockets
    carry prompts' token ids, unauthenticated, so the folder's permissions are their guard."""
    try:
        st = os.stat(events_dir)
    except OSError as exc:
        raise ConfigError("vllm.events_dir", events_dir, f"cannot be used: {exc}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError("vllm.events_dir", events_dir,
                          f"must be a folder of this user with mode 0700 (it is "
                          f"{oct(st.st_mode & 0o777)}, uid {st.st_uid}): its sockets carry the "
                          f"prompts' token ids without authentication")


def _hashable(value: object) -> Hashable:
    return bytes(value) if isinstance(value, bytearray | list) else value


def parse_event(raw: object) -> BlockEvent | None:
    """One decoded event map as a block event; None for what cannot be a plain-prompt hit
    (extra keys) or an unknown event type."""
    if not isinstance(raw, Mapping):
        return None
    kind = raw.get("type")
    if kind == "BlockStored":
        if any(k is not None for k in raw.get("extra_keys") or ()):
            return None
        parent = raw.get("parent_block_hash")
        return BlockStored(tuple(_hashable(h) for h in raw["block_hashes"]),
                           None if parent is None else _hashable(parent),
                           tuple(int(t) for t in raw["token_ids"]), int(raw["block_size"]),
                           int(raw.get("group_idx") or 0),
                           str(raw.get("kv_cache_spec_kind") or "full_attention"))
    if kind == "BlockRemoved":
        return BlockRemoved(tuple(_hashable(h) for h in raw["block_hashes"]),
                            int(raw.get("group_idx") or 0))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def parse_batch(payload: bytes) -> list[BlockEvent]:
    """A KVEventBatch's events (skipped ones left out). Raises ValueError on a bad payload."""
    import msgspec

    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"KV event batch is not msgpack: {exc}") from exc
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError(f"KV event batch is not [ts, events, ...]: {str(batch)[:100]}")
    try:
        parsed = [parse_event(e) for e in batch[1]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"bad KV event in batch: {exc}") from exc
    return [e for e in parsed if e is not None]


class VllmKvEvents:
    """Subscribes to the instances' KV events and keeps `listener` current (see module doc).
    Runs as one asyncio task in the router's loop, so the manager is touched by one thread."""

    def __init__(self, endpoints: Mapping[str, str], listener: PoolListener,
                 block_size_tokens: int) -> None:
        self.endpoints = dict(endpoints)  # worker name -> tcp://host:port or ipc://path
        self.indexes = {name: EngineBlockIndex(name, listener, block_size_tokens)
                        for name in self.endpoints}
        self._last_seq: dict[str, int] = {}
        self.bad_batches = 0
        self._size_warned: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._ctx: Any = None

    @property
    def stats(self) -> dict[str, EventStats]:
        return {name: index.stats for name, index in self.indexes.items()}

    def forget(self, name: str) -> None:
        """The instance restarted (the membership saw a new pid): its cache is empty."""
        if name in self.indexes:
            self.indexes[name].reset()
            self._last_seq.pop(name, None)

    def handle(self, name: str, seq: int, payload: bytes) -> None:
        """One message of instance `name` (sequence number `seq`)."""
        last = self._last_seq.get(name)
        index = self.indexes[name]
        if last is not None and seq != last + 1:
            log.warning("KV events of %s: sequence %d after %d; events lost, index reset",
                        name, seq, last)
            index.reset()
        self._last_seq[name] = seq
        try:
            events = parse_batch(payload)
        except ValueError as exc:
            self.bad_batches += 1
            log.warning("KV events of %s: %s; index reset", name, exc)
            index.reset()
            return
        for event in events:
            if isinstance(event, BlockStored) and \
                    event.block_size_tokens != index.block_size_tokens and \
                    name not in self._size_warned:
                self._size_warned.add(name)
                log.warning("KV events of %s: vLLM's block size is %d tokens, the topology's "
                            "vllm.block_size_tokens %d: no event can be placed; set it to %d",
                            name, event.block_size_tokens, index.block_size_tokens,
                            event.block_size_tokens)
        index.apply_batch(events)  # whole: a hybrid step's state events precede its attention's

    def start(self) -> None:
        import zmq
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        sockets = {}
        for name, endpoint in self.endpoints.items():
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, name.encode())
            sock.connect(endpoint)
            sockets[name] = sock
        self._task = asyncio.create_task(self._run(sockets))

    async def _run(self, sockets: dict[str, Any]) -> None:
        import zmq
        import zmq.asyncio

        poller = zmq.asyncio.Poller()
        by_socket = {}
        for name, sock in sockets.items():
            poller.register(sock, zmq.POLLIN)
            by_socket[sock] = name
        try:
            while True:
                for sock, _ in await poller.poll():
                    frames = await sock.recv_multipart()
                    name = by_socket[sock]
                    if len(frames) != 3 or frames[0] != name.encode() or len(frames[1]) != 8:
                        self.bad_batches += 1
                        continue
                    self.handle(name, int.from_bytes(frames[1], "big", signed=True), frames[2])
        finally:
            for sock in sockets.values():
                sock.close(0)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
