"""What the dispatcher does when an attempt fails, kept apart from the happy path.

- `guarded`: relay an attempt's token events, but end it at once (AttemptFailed) when a
  worker it depends on goes down (membership's down event), instead of waiting for a timeout.
- `wait_for_path`: what the retry policy (policy/retry.py, the object the simulator calls too)
  decides for the failed request on the current view, asked again every `poll_s` while it
  finds no path, for up to `health.path_wait_s`: the clock lives here, the decision there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from prfaas.core.types import ClusterView
from prfaas.policy.retry import FailedRequest, RetryAction, RetryDecision, RetryPolicy
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


async def wait_for_path(retry: RetryPolicy, failed: FailedRequest,
                        view: Callable[[], ClusterView], wait_s: float, poll_s: float
                        ) -> RetryDecision:
    """The policy's decision once it is not NO_PATH; the last NO_PATH after `wait_s` s."""
    deadline = time.monotonic() + wait_s
    while True:
        verdict = retry.after_failure(failed, view())
        if verdict.action is not RetryAction.NO_PATH or time.monotonic() >= deadline:
            return verdict
        await asyncio.sleep(poll_s)
