"""Continuous batching for a decode worker: one loop, requests join and leave between steps.

`admit` adds a running request (its first token already emitted by the caller); the loop runs
`Engine.decode_step` in a thread over up to `max_batch` running requests (the rest wait in
`waiting`, first come first served), pushes each new token to the request's queue and retires
requests at EOS or `max_tokens`. The stop rule is `Engine.generate`'s, so the tokens match it.
A request whose consumer went away is dropped at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

from prfaas.engine import DecodeSeq, Engine

# Events on a request's queue: a token id, or a finish reason string ("stop" | "length" |
# "error: ..."), after which nothing follows.
Event = int | str


@dataclass(slots=True)
class Active:
    seq: DecodeSeq
    max_tokens: int
    emitted: int = 0
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: bool = False

    def offer(self, token: int, eos_id: int) -> bool:
        """Emit `token` under generate's rule; True when the request is finished."""
        if token == eos_id and not self.seq.sampling.ignore_eos:
            self.events.put_nowait("stop")
            return True
        self.events.put_nowait(token)
        self.emitted += 1
        if self.emitted >= self.max_tokens:
            self.events.put_nowait("length")
            return True
        return False


class Batcher:
    def __init__(self, engine: Engine, max_batch: int) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.running: list[Active] = []
        self.waiting: deque[Active] = deque()
        self.steps = 0
        self.step_s_total = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def admit(self, active: Active) -> None:
        self.waiting.append(active)
        self._wake.set()

    @property
    def free_slots(self) -> int:
        return max(self.max_batch - len(self.running) - len(self.waiting), 0)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._fill()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = list(self.running)
            t0 = loop.time()
            try:
                tokens = await asyncio.to_thread(self.engine.decode_step, [a.seq for a in batch])
            except Exception as exc:  # an engine failure ends these requests, not the worker
                for a in batch:
                    a.events.put_nowait(f"error: {type(exc).__name__}: {exc}")
                self.running = [a for a in self.running if a not in batch]
                continue
            self.steps += 1
            self.step_s_total += loop.time() - t0
            done = {id(a) for a, t in zip(batch, tokens, strict=True)
                    if a.offer(t, self.engine.tokenizer.eos_id)}
            self.running = [a for a in self.running if id(a) not in done and not a.cancelled]

    def _fill(self) -> None:
        self.running = [a for a in self.running if not a.cancelled]
        while self.waiting and len(self.running) < self.max_batch:
            active = self.waiting.popleft()
            if not active.cancelled:
                self.running.append(active)
