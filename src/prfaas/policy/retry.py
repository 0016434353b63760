"""What happens to a request whose attempt failed (a worker or the link went down under it).

`RetryPolicy.after_failure(failed, view)` is called by the live dispatcher (serve/dispatch.py)
and by the simulator's failover (sim/failover.py) with the request's state and the current
`ClusterView`; it returns a `RetryDecision`, checked in this order:
- GIVE_UP: more than `max_retries` failed attempts, or tokens of several sequences (n > 1)
  were already sent (they share no one prefix to resume from);
- FINISHED: the failed attempt had already sent its last token (`output_tokens` reached, or
  a stop): nothing to re-run, `reason` is the finish reason ("length", "stop"); a request that
  sent no token is never finished (with max_tokens 0 the prefill's echo is still owed);
- NO_PATH: no path can serve now (`decision` is the refusal); the caller may wait and ask
  again (live, up to `health.path_wait_s`) or lose the request (the simulator);
- RETRY: no token was sent yet: the request runs again from its prompt on `decision`;
- RESUME: tokens were sent: prompt + the emitted tokens are the new prompt, re-prefilled on
  `decision`, and decoding continues for the `output_tokens - emitted` tokens left (`query`).
The new path is the local one (`decide(..., Route.PD)`: a PD-P instance; PrfaaS only when no
PD-P instance is up and the link is): the failure was most likely on the remote path, and the
local one does not depend on the link.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from prfaas.core.errors import ConfigError
from prfaas.core.types import ClusterView, Route, RouteDecision, RouteQuery
from prfaas.policy.base import decide


@dataclass(frozen=True, slots=True)
class FailedRequest:
    """A request after a failed attempt, as the retry policy sees it."""

    query: RouteQuery  # as first routed: the prompt, the output tokens asked for, cached prefixes
    emitted_tokens: int = 0  # tokens the client already has (of every attempt)
    failures: int = 1  # failed attempts so far, this one included
    sequences: int = 1  # parallel sequences (n / best_of): tokens of several have no one prefix
    stopped: bool = False  # the last emitted token ended the sequence (a stop token)
    threshold_tokens: int | None = None  # the t to record on the new decision


class RetryAction(StrEnum):
    RETRY = "retry"
    RESUME = "resume"
    FINISHED = "finished"
    NO_PATH = "no_path"
    GIVE_UP = "give_up"


@dataclass(frozen=True, slots=True)
class RetryDecision:
    action: RetryAction
    decision: RouteDecision | None = None  # RETRY / RESUME: where; NO_PATH: the refusal
    query: RouteQuery | None = None  # RETRY / RESUME: the request to run (resumed: + emitted)
    reason: str = ""  # GIVE_UP, NO_PATH: why; FINISHED: the finish reason


def resume_query(query: RouteQuery, emitted_tokens: int) -> RouteQuery:
    """The request as it stands after `emitted_tokens`: they join the prompt and leave the
    output budget. The cached prefixes of the prompt still apply (a prefix of a prefix)."""
    info = query.request
    return replace(query, request=replace(info, input_tokens=info.input_tokens + emitted_tokens,
                                          output_tokens=info.output_tokens - emitted_tokens))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int | None = None  # failed attempts re-run per request; None: no limit

    def __post_init__(self) -> None:
        if self.max_retries is not None and self.max_retries < 0:
            raise ConfigError("max_retries", self.max_retries, "must be >= 0")

    def after_failure(self, failed: FailedRequest, view: ClusterView) -> RetryDecision:
        emitted = failed.emitted_tokens
        if self.max_retries is not None and failed.failures > self.max_retries:
            return RetryDecision(RetryAction.GIVE_UP,
                                 reason=f"{failed.failures} failed attempts "
                                        f"(max_retries {self.max_retries})")
        if emitted and failed.sequences > 1:
            return RetryDecision(RetryAction.GIVE_UP,
                                 reason=f"tokens of its {failed.sequences} sequences were sent")
        if emitted and emitted >= failed.query.request.output_tokens:
            return RetryDecision(RetryAction.FINISHED, reason="length")
        if emitted and failed.stopped:
            return RetryDecision(RetryAction.FINISHED, reason="stop")
        query = resume_query(failed.query, emitted) if emitted else failed.query
        decision = decide(query, view, Route.PD, failed.threshold_tokens)
        if decision.rejected or decision.decode_instance is None:
            return RetryDecision(RetryAction.NO_PATH, decision, reason=decision.reason)
        action = RetryAction.RESUME if emitted else RetryAction.RETRY
        return RetryDecision(action, decision, query)
