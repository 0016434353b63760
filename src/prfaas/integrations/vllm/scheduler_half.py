"""PrfaasConnector's scheduler half (runs in vLLM's EngineCore process).

Prefill instance (`role: send`): a model with Mamba/GDN layers stops one token short of the
prompt (the decoder recomputes it from h(N-1), as NIXL does) and generates one token; every step
that computes part of the prompt yields a `SaveJob` naming the blocks completed by that step,
so chunked prefill streams chunk by chunk. Decode instance (`role: recv`): the prompt's tokens
beyond the local prefix hit are an asynchronous external hit; the request waits in
WAITING_FOR_REMOTE_KVS while the engine keeps serving others, and a `LoadJob` hands its
destination blocks to the worker half. Byte counts leave in `request_finished`'s params: a
prefill's tensor bytes as queued (`kv_bytes`), a decode's wire bytes as its load received them
(`kv_wire_bytes`, compressed where they were: the producer answers before its sender is done).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.utils import clip_ssm_state_blocks
from vllm.v1.kv_cache_interface import MambaSpec

from prfaas.integrations.vllm.kv_security import tokens_sha256
from prfaas.integrations.vllm.metadata import LoadJob, PrfaasMetadata, PrfaasWorkerMeta, SaveJob
from prfaas.integrations.vllm.params import KEY, RecvParams, SendParams, fingerprint, parse

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class _Sending:
    request: Request
    params: SendParams
    num_tokens: int
    fingerprint: int
    next_block: list[int]  # per group: first block not yet sent
    tokens_sha256: str = ""
    first: bool = True


@dataclass(slots=True)
class _Receiving:
    params: RecvParams
    local_hit: int = 0
    started: bool = False  # a LoadJob went out; the worker reports its end
    done: bool = False
    wire_bytes: int | None = None  # what the valid load took on the link (the worker's count)


@dataclass(slots=True)
class SchedulerHalf:
    kv_cache_config: KVCacheConfig
    manager: KVCacheManager | None = None
    _sending: dict[str, _Sending] = field(default_factory=dict)
    _receiving: dict[str, _Receiving] = field(default_factory=dict)
    _loads: list[LoadJob] = field(default_factory=list)
    _aborted: list[int] = field(default_factory=list)
    _abort_sends: list[tuple[int, tuple[str, int], float | None]] = field(default_factory=list)
    _sent_bytes: dict[str, int] = field(default_factory=dict)  # from the worker (counted)

    @property
    def backoff(self) -> int:
        return 1 if self.kv_cache_config.has_mamba_layers else 0

    def _specs(self) -> list[Any]:
        return [g.kv_cache_spec for g in self.kv_cache_config.kv_cache_groups]

    def _state_slots(self, block_ids: tuple[list[int], ...]) -> tuple[int | None, ...]:
        out: list[int | None] = []
        for spec, ids in zip(self._specs(), block_ids, strict=True):
            if isinstance(spec, MambaSpec):
                kept = clip_ssm_state_blocks(list(ids), spec.num_speculative_blocks)
                out.append(kept[-1] if kept else None)
            else:
                out.append(None)
        return tuple(out)

    def _block_ids(self, req_id: str) -> tuple[list[int], ...]:
        assert self.manager is not None, "bind_kv_cache_manager was not called"
        return self.manager.get_block_ids(req_id)

    # -- both roles ---------------------------------------------------------------------
    def on_new_request(self, request: Request) -> None:
        p = parse(request.kv_transfer_params)
        if isinstance(p, SendParams):
            if self.backoff and request.num_prompt_tokens > self.backoff and (
                    request.prompt_token_ids is not None):
                del request.prompt_token_ids[-self.backoff:]
                del request._all_token_ids[-self.backoff:]
                request.num_prompt_tokens -= self.backoff
            # two tokens, not one: the worker's byte count of the prompt's last step reaches
            # this half with that step's output, after vLLM has finished a 1-token request
            # (and returned its kv_transfer_params); one more decode step carries it out
            request.max_tokens = 2
            if request.sampling_params is not None:  # the Worker validates min <= max
                request.sampling_params.max_tokens = 2
                request.sampling_params.min_tokens = 2
            ids = list(request.prompt_token_ids or [])
            self._sending[request.request_id] = _Sending(
                request, p, len(ids), fingerprint(ids), [0] * len(self._specs()),
                tokens_sha256(ids, len(ids)))
        elif isinstance(p, RecvParams):
            self._receiving[request.request_id] = _Receiving(p)

    def _load_tokens(self, request: Request) -> int:
        n = len(request.prompt_token_ids or [])
        return n - self.backoff if n > self.backoff else n

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        rx = self._receiving.get(request.request_id)
        if rx is None or rx.started:
            return 0, False
        count = self._load_tokens(request) - num_computed_tokens
        if count <= 0:
            return 0, False
        rx.local_hit = num_computed_tokens
        return count, True

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        rx = self._receiving.get(request.request_id)
        if rx is None or rx.started or num_external_tokens <= 0:
            return
        rx.started = True
        ids = self._block_ids(request.request_id)
        n = self._load_tokens(request)
        prompt = list(request.prompt_token_ids or [])[:n]
        self._loads.append(LoadJob(
            request.request_id, rx.params.transfer_id, tuple(list(g) for g in ids),
            self._state_slots(ids), rx.local_hit, n, fingerprint(prompt), rx.params.timeout_s,
            rx.params.fault, rx.params.nonce, tokens_sha256(prompt, n)))

    def build_connector_meta(self, out: SchedulerOutput) -> PrfaasMetadata:
        meta = PrfaasMetadata(loads=self._loads, aborted=self._aborted,
                              abort_sends=self._abort_sends)
        self._loads, self._aborted, self._abort_sends = [], [], []
        for req_id, num_new in out.num_scheduled_tokens.items():
            tx = self._sending.get(req_id)
            if tx is None or tx.request.num_computed_tokens >= tx.num_tokens:
                continue
            job = self._save_job(tx, tx.request.num_computed_tokens + num_new)
            meta.saves.append(job)
        return meta

    def _save_job(self, tx: _Sending, end: int) -> SaveJob:
        last = end >= tx.num_tokens
        ids = self._block_ids(tx.request.request_id)
        blocks: list[tuple[list[int], int]] = []
        for g, spec in enumerate(self._specs()):
            if isinstance(spec, MambaSpec):
                blocks.append(([], 0))
                continue
            upto = _cdiv(tx.num_tokens, spec.block_size) if last else end // spec.block_size
            start = tx.next_block[g]
            blocks.append((list(ids[g][start:upto]), start))
            tx.next_block[g] = max(start, upto)
        job = SaveJob(tx.request.request_id, tx.params.transfer_id,
                      (tx.params.dest_host, tx.params.dest_port), tuple(blocks), tx.num_tokens,
                      tx.fingerprint, tx.first, last, self._state_slots(ids) if last else (),
                      tx.params.rate_gbps, tx.params.after_prefill, tx.params.nonce,
                      tx.tokens_sha256, tx.params.wire_dtype)
        tx.first = False
        return job

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        meta = output.kv_connector_worker_meta
        if isinstance(meta, PrfaasWorkerMeta):
            self._sent_bytes.update((r, n) for r, n in meta.sent_bytes.items()
                                    if r in self._sending)
            for req_id, n in meta.received_wire_bytes.items():
                got = self._receiving.get(req_id)
                if got is not None:
                    got.wire_bytes = n
        for req_id in output.finished_recving or ():
            rx = self._receiving.get(req_id)
            if rx is not None:
                rx.done = True

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        """vLLM itself keeps an aborted WAITING_FOR_REMOTE_KVS request's blocks until the worker
        reports it received; the worker half stops writing into them first (`aborted`)."""
        tx = self._sending.pop(request.request_id, None)
        if tx is not None and not tx.first and tx.request.num_computed_tokens < tx.num_tokens:
            # aborted mid-prompt: tell the receiver, so the stream does not stay open
            self._abort_sends.append((tx.params.transfer_id,
                                      (tx.params.dest_host, tx.params.dest_port),
                                      tx.params.rate_gbps))
        rx = self._receiving.pop(request.request_id, None)
        if rx is not None and rx.started and not rx.done:
            self._aborted.append(rx.params.transfer_id)
        sent = self._sent_bytes.pop(request.request_id, None)
        if sent is not None:  # the prefill's reply: the bytes its KV transfer queued
            return False, {KEY: {"kv_bytes": sent}}
        if rx is not None and rx.wire_bytes is not None:
            # the decode's: what its KV took on the wire (the stream's last event, stream.py)
            return False, {KEY: {"kv_wire_bytes": rx.wire_bytes}}
        return False, None
