"""What the dispatcher does when an attempt fails, kept apart from the happy path.

- `guarded`: relay an attempt's token events, but end it at once (AttemptFailed) when a
  worker it depends on goes down (membership's down event), instead of waiting for a timeout.
- `resume_query`: the request as it stands after `emitted` tokens: prompt + emitted tokens is
  the new prompt (re-prefilled on a healthy path), max_tokens - emitted is what is left.
- `next_path`: a local-path decision for it on the current view (policy.base.decide falls back
  to the other cluster), waiting up to `health.path_wait_s` for a path to come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from prfaas.core.types import ClusterView, Route, RouteDecision, RouteQuery
from prfaas.policy.base import decide
from prfaas.serve.router.backends import AttemptFailed, TokenEvent


async def guarded(events: AsyncIterator[TokenEvent],
                  watch: Callable[[], list[tuple[str, asyncio.Event]]]
                  ) -> AsyncIterator[TokenEvent]:
    """`events`, cut short when one of `watch()` (name, down event) fires."""
    it = events.__aiter__()
    nxt: asyncio.Future[TokenEvent] | None = None
    try:
        while True:
            nxt = asyncio.ensure_future(it.__anext__())
            waiters = {asyncio.ensure_future(ev.wait()): name for name, ev in watch()}
            try:
                done, _ = await asyncio.wait({nxt, *waiters},
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
            if nxt not in done:
                down = sorted(name for w, name in waiters.items() if w in done)
                raise AttemptFailed(f"{', '.join(down)} went down during the attempt")
            try:
                event = nxt.result()
            except StopAsyncIteration:
                return
            nxt = None
            yield event
    finally:
        if nxt is not None and not nxt.done():
            nxt.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await nxt


def resume_query(query: RouteQuery, emitted: int) -> RouteQuery:
    info = query.request
    return replace(query, request=replace(info, input_tokens=info.input_tokens + emitted))


async def next_path(query: RouteQuery, view: Callable[[], ClusterView], threshold: int | None,
                    wait_s: float, poll_s: float) -> RouteDecision:
    """A local-path decision that can run; the last refusal after `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        decision = decide(query, view(), Route.PD, threshold)
        if not decision.rejected and decision.decode_instance is not None:
            return decision
        if time.monotonic() >= deadline:
            return decision
        await asyncio.sleep(poll_s)
