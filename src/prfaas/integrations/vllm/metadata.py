"""What PrfaasConnector's scheduler half tells its worker half each engine step.

`SaveJob`: a prefill instance's request that computes this step; which blocks of each cache
group became complete (they are sent from `save_kv_layer`, layer by layer), and on the step that
ends the prompt, the recurrent-state slot of each Mamba/GDN group (sent from `wait_for_save`).
`LoadJob`: a decode instance's request that now owns destination blocks and waits for its KV.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)


@dataclass(frozen=True, slots=True)
class SaveJob:
    req_id: str
    transfer_id: int
    dest: tuple[str, int]
    # per cache group: (block ids to send now, index of the first in the request's list)
    blocks: tuple[tuple[list[int], int], ...]
    num_tokens: int  # prompt tokens this instance computes (the KV that crosses)
    fingerprint: int  # of those tokens
    first: bool  # the request's first save step: the meta tensor goes first
    last: bool  # the prompt ends this step: states, then END
    state_blocks: tuple[int | None, ...] = ()  # per group on the last step; None: not Mamba
    rate_gbps: float | None = None  # None: the instance's link rate
    after_prefill: bool = False  # hold every layer until the prompt is done (a baseline)
    nonce: str = ""  # the attempt's one-time value (manifest)
    tokens_sha256: str = ""  # of the token ids sent (manifest)
    wire_dtype: str | None = None  # this request's (params.WIRE_DTYPES); None: the instance's


@dataclass(frozen=True, slots=True)
class LoadJob:
    req_id: str
    transfer_id: int
    block_ids: tuple[list[int], ...]  # destination, per cache group (the request's whole list)
    state_blocks: tuple[int | None, ...]  # destination state slot per group; None: not Mamba
    skip_tokens: int  # prompt tokens this instance already holds (local prefix hit): kept
    num_tokens: int  # prompt tokens expected
    fingerprint: int
    timeout_s: float
    fault: str | None = None  # params.FAULTS: a negative control's wrong write (tests only)
    nonce: str = ""  # the manifest must carry it
    tokens_sha256: str = ""  # of the token ids expected (manifest)


@dataclass(slots=True)
class PrfaasWorkerMeta(KVConnectorWorkerMetadata):
    """Worker -> scheduler: payload bytes each finished prefill handed to the link (counted
    tensor by tensor as they were queued: meta, blocks, states), and (consumer) the bytes each
    valid load took on the wire, compressed where they were (the receiver's count)."""

    sent_bytes: dict[str, int] = field(default_factory=dict)  # request id -> bytes
    received_wire_bytes: dict[str, int] = field(default_factory=dict)  # request id -> bytes

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, PrfaasWorkerMeta)
        # tensor-parallel workers: each counts its shards, the request's total is the sum
        return PrfaasWorkerMeta(_summed(self.sent_bytes, other.sent_bytes),
                                _summed(self.received_wire_bytes, other.received_wire_bytes))


def _summed(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    merged = dict(a)
    for req_id, n in b.items():
        merged[req_id] = merged.get(req_id, 0) + n
    return merged


@dataclass(slots=True)
class PrfaasMetadata(KVConnectorMetadata):
    saves: list[SaveJob] = field(default_factory=list)
    loads: list[LoadJob] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)  # transfer ids no longer awaited
    # prefill requests that ended before their prompt did: (transfer id, dest, rate)
    abort_sends: list[tuple[int, tuple[str, int], float | None]] = field(default_factory=list)
