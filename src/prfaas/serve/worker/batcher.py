"""Continuous batching for a decode worker: one loop, requests join and leave between steps.

`admit` adds a running request (its first token already emitted by the caller); the loop runs
`Engine.decode_step` in a thread over up to `max_batch` running requests (the rest wait in
`waiting`, first come first served), pushes each new token (with its logprobs, `seq.last`) to
the request's queue and retires requests at EOS, a stop token id, a stop string (stops.py, the
router's matcher) or `max_tokens`. The stop rule is `Engine.generate`'s, so the tokens match
it. The n sequences of one request (n > 1) share a queue; events carry the sequence index.
A request whose consumer went away is dropped at the next step.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from prfaas.engine import DecodeSeq, EngineBase
from prfaas.engine.sampling import Sampled, is_stop
from prfaas.serve.stops import StopText
from prfaas.serve.tasks import cancel_and_wait

# Events on a request's queue: (sequence index, a sampled token or a finish reason string
# ("stop" | "length" | "error: ...")); nothing follows a sequence's finish reason.
Event = tuple[int, Sampled | str]


@dataclass(slots=True)
class Active:
    seq: DecodeSeq
    max_tokens: int
    emitted: int = 0
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    index: int = 0  # which of the request's n sequences
    stops: StopText | None = None

    def offer(self, token: Sampled | int, eos_id: int) -> bool:
        """Emit `token` under generate's rule; True when the sequence is finished."""
        sampled = token if isinstance(token, Sampled) else Sampled(token, 0.0)
        if is_stop(sampled.token, self.seq.sampling, eos_id):
            self.events.put_nowait((self.index, "stop"))
            return True
        self.events.put_nowait((self.index, sampled))
        self.emitted += 1
        if self.stops is not None:
            self.stops.feed(sampled.token)
            if self.stops.stopped:
                self.events.put_nowait((self.index, "stop"))
                return True
        if self.emitted >= self.max_tokens:
            self.events.put_nowait((self.index, "length"))
            return True
        return False


class Batcher:
    def __init__(self, engine: EngineBase, max_batch: int) -> None:
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
        await cancel_and_wait(self._task)

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
                    a.events.put_nowait((a.index, f"error: {type(exc).__name__}: {exc}"))
                self.running = [a for a in self.running if a not in batch]
                continue
            self.steps += 1
            self.step_s_total += loop.time() - t0
            eos = self.engine.tokenizer.eos_id
            done = {id(a) for a, t in zip(batch, tokens, strict=True)
                    if a.offer(_sampled(a.seq, t), eos)}
            self.running = [a for a in self.running if id(a) not in done and not a.cancelled]

    def _fill(self) -> None:
        self.running = [a for a in self.running if not a.cancelled]
        while self.waiting and len(self.running) < self.max_batch:
            active = self.waiting.popleft()
            if not active.cancelled:
                self.running.append(active)


def _sampled(seq: DecodeSeq, token: int) -> Sampled:
    """The step's token with its logprobs (an engine whose decode_step sets no `seq.last`
    reports logprob 0)."""
    last = seq.last
    return last if last is not None and last.token == token else Sampled(token, 0.0)
