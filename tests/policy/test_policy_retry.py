"""The retry policy (policy/retry.py): every branch of `after_failure`, on a scripted view.
The live dispatcher and the simulator's failover both call it."""

from dataclasses import replace

import pytest
from policy_fakes import FakeView, query, without

from prfaas.core.errors import ConfigError
from prfaas.core.types import LinkStatus, Route
from prfaas.policy.retry import FailedRequest, RetryAction, RetryPolicy, resume_query

DOWN = LinkStatus(100.0, up=False)
LONG = 30_000  # output_tokens of `query` is 64


def failed(emitted: int = 0, **kw: object) -> FailedRequest:
    return FailedRequest(query(LONG, {"pd-p1": 4_096}), emitted, **kw)  # type: ignore[arg-type]


def test_no_token_yet_is_a_retry_of_the_same_request_on_the_local_path() -> None:
    view = FakeView()  # PrfaaS prefills 4x faster here: a plain router would pick it
    view.set_queue("pd-p0", 0.5)
    got = RetryPolicy().after_failure(failed(threshold_tokens=19_500), view)
    assert got.action is RetryAction.RETRY
    assert got.query == failed().query  # from its prompt, cached prefixes and all
    d = got.decision
    assert d is not None and d.route is Route.PD and d.threshold_tokens == 19_500
    assert d.prefill_instance == "pd-p1" and d.cached_tokens == 4_096  # its cache counts
    assert d.uncached_tokens == LONG - 4_096 and d.decode_instance == "pd-d0"


def test_tokens_sent_is_a_resume_of_prompt_plus_emitted_for_the_tokens_left() -> None:
    got = RetryPolicy().after_failure(failed(emitted=10), FakeView())
    assert got.action is RetryAction.RESUME
    assert got.query is not None and got.decision is not None
    assert got.query.request.input_tokens == LONG + 10
    assert got.query.request.output_tokens == 64 - 10
    assert got.query.cached_tokens == {"pd-p1": 4_096}  # a prefix of the longer prompt too
    assert got.decision.route is Route.PD
    assert got.decision.uncached_tokens == LONG + 10 - got.decision.cached_tokens


def test_resume_query_moves_tokens_from_output_to_prompt() -> None:
    q = query(100)
    assert resume_query(q, 0) == q
    r = resume_query(q, 7).request
    assert (r.input_tokens, r.output_tokens, r.request_id) == (107, 57, "r0")


def test_without_a_pd_p_instance_the_retry_falls_back_to_prfaas() -> None:
    got = RetryPolicy().after_failure(failed(), without(FakeView(), "pd-p"))
    assert got.action is RetryAction.RETRY and got.decision is not None
    assert got.decision.route is Route.PRFAAS and "fell back" in got.decision.reason


@pytest.mark.parametrize(("down", "link", "why"), [
    (("pd-p",), DOWN, "no PD-P instance up and the inter-cluster link is down"),
    (("pd-p", "prf-"), None, "no PD-P instance up and no PrfaaS"),
    (("pd-d",), None, "no decode instance up"),
])
def test_no_path_names_what_is_missing(down: tuple[str, ...], link: LinkStatus | None,
                                       why: str) -> None:
    got = RetryPolicy().after_failure(failed(emitted=3), without(FakeView(), *down, link=link))
    assert got.action is RetryAction.NO_PATH and why in got.reason
    assert got.decision is not None and got.decision.unavailable


def test_failures_beyond_max_retries_give_up_and_not_before() -> None:
    policy = RetryPolicy(max_retries=3)
    assert policy.after_failure(failed(failures=3), FakeView()).action is RetryAction.RETRY
    got = policy.after_failure(failed(failures=4), FakeView())
    assert got.action is RetryAction.GIVE_UP and "max_retries 3" in got.reason
    assert RetryPolicy(max_retries=0).after_failure(failed(), FakeView()).action \
        is RetryAction.GIVE_UP
    unbounded = RetryPolicy().after_failure(failed(failures=10_000), FakeView())
    assert unbounded.action is RetryAction.RETRY
    # the limit comes first: even a request with nowhere to go gives up, not waits
    assert policy.after_failure(failed(failures=4), without(FakeView(), "pd-d")).action \
        is RetryAction.GIVE_UP


def test_several_sequences_give_up_only_once_tokens_were_sent() -> None:
    policy = RetryPolicy()
    assert policy.after_failure(failed(sequences=2), FakeView()).action is RetryAction.RETRY
    got = policy.after_failure(failed(emitted=1, sequences=2), FakeView())
    assert got.action is RetryAction.GIVE_UP and "2 sequences" in got.reason


def test_every_token_sent_or_a_stop_is_finished_without_a_path() -> None:
    policy, nowhere = RetryPolicy(), without(FakeView(), "pd-d")
    got = policy.after_failure(failed(emitted=64), nowhere)
    assert (got.action, got.reason, got.decision) == (RetryAction.FINISHED, "length", None)
    got = policy.after_failure(failed(emitted=5, stopped=True), nowhere)
    assert (got.action, got.reason) == (RetryAction.FINISHED, "stop")
    # one token short, or no stop: still to be resumed
    assert policy.after_failure(failed(emitted=63), FakeView()).action is RetryAction.RESUME
    assert policy.after_failure(failed(emitted=5), FakeView()).action is RetryAction.RESUME
    assert policy.after_failure(failed(stopped=True), FakeView()).action is RetryAction.RETRY
    # nothing sent is never finished (max_tokens 0: the prefill's echo is still owed)
    zero = replace(failed(), query=replace(failed().query, request=replace(
        failed().query.request, output_tokens=0)))
    assert policy.after_failure(zero, FakeView()).action is RetryAction.RETRY


def test_negative_max_retries_is_rejected() -> None:
    with pytest.raises(ConfigError, match="max_retries"):
        RetryPolicy(max_retries=-1)
