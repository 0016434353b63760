"""PrfaasConnector: a vLLM v1 KV connector that streams KV layer by layer over prfaas.transport.

Load it out of tree:
    --kv-transfer-config '{"kv_connector": "PrfaasConnector", "kv_role": "kv_producer",
      "kv_connector_module_path": "prfaas.integrations.vllm.connector",
      "kv_connector_extra_config": {"rate_gbps": 0.05, "connections": 4}}'
(`kv_consumer` with `"kv_port": N` on the decode instance). Per-request instructions travel in
the OpenAI body's `kv_transfer_params` (params.py). The scheduler half (EngineCore process) and
the worker half (Worker process) are separate objects of this class, by `role`.
A producer sends layer by layer from `save_kv_layer`, so on a GPU it asks vLLM for PIECEWISE
CUDA graphs (`requires_piecewise_for_cudagraph`): FULL graphs replay the forward without the
Python that calls it. Its layers leave the GPU through the layer shipper (engine/shipper.py):
a copy stream, a pinned host ring, events; `wait_for_save` waits for nothing on the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)

from prfaas.integrations.vllm import seed_offset
from prfaas.integrations.vllm.kv_security import model_identity
from prfaas.integrations.vllm.metadata import PrfaasMetadata, PrfaasWorkerMeta
from prfaas.integrations.vllm.scheduler_half import SchedulerHalf
from prfaas.integrations.vllm.worker_half import WorkerHalf

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


def sends_kv(extra: dict[str, Any] | None) -> bool:
    """Whether an instance with this `kv_connector_extra_config` is a producer: a consumer is
    told its receiver's `kv_port` (deploy.py writes it for `pd-d` workers only)."""
    return (extra or {}).get("kv_port") is None


def _model_id(vllm_config: VllmConfig, extra: dict[str, Any]) -> str:
    """The manifest's model identity: an operator's pinned value, else the model folder's
    files and the settings that change the KV's bytes (dtype, mamba state dtypes)."""
    if extra.get("model_identity"):
        return str(extra["model_identity"])
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    detail = (f"dtype={mc.dtype};cache={cc.cache_dtype};mamba={cc.mamba_cache_dtype}/"
              f"{cc.mamba_ssm_cache_dtype};revision={mc.revision}")
    return model_identity(str(mc.model), detail)


class PrfaasConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        tc = self._kv_transfer_config
        self.sched: SchedulerHalf | None = None
        self.worker: WorkerHalf | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.sched = SchedulerHalf(kv_cache_config)
        else:
            extra = dict(tc.kv_connector_extra_config or {})
            self.worker = WorkerHalf(kv_cache_config, extra, producer=tc.is_kv_producer,
                                     consumer=tc.is_kv_consumer, model_id=_model_id(vllm_config,
                                                                                    extra))
            if tc.is_kv_consumer:  # a resumed request's seeded sampling goes on (seed_offset)
                seed_offset.install(bool(getattr(vllm_config.model_config, "use_fp64_gumbel",
                                                 False)))

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """A producer (no `kv_port`: it sends) saves layer by layer inside the forward;
        a consumer's decode steps keep FULL graphs (it saves nothing)."""
        return sends_kv(extra_config)

    def _meta(self) -> PrfaasMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, PrfaasMetadata)
        return meta

    def _s(self) -> SchedulerHalf:
        assert self.sched is not None
        return self.sched

    def _w(self) -> WorkerHalf:
        assert self.worker is not None
        return self.worker

    # -- scheduler side -----------------------------------------------------------------
    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self._s().manager = kv_cache_manager

    def on_new_request(self, request: Request) -> None:
        self._s().on_new_request(request)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        return self._s().get_num_new_matched_tokens(request, num_computed_tokens)

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        # the request's own blocks of every group cross, recurrent state included
        return tuple(range(len(self._kv_cache_config.kv_cache_groups)))

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        self._s().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._s().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._s().update_connector_output(connector_output)

    def request_finished(self, request: Request, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        return self._s().request_finished(request)

    def request_finished_all_groups(self, request: Request, block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        return self._s().request_finished(request)

    # -- worker side --------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._w().register(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if self._w().recv is not None:
            self._w().start_loads(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: a request runs only once its whole KV is in

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        if self._w().send is not None and self._meta().saves:
            self._w().save_layer(self._meta(), layer_name, kv_layer)

    def wait_for_save(self) -> None:
        # the step's reads of the paged cache are ordered before its next writes on the device;
        # the copies to the host and the network are the sender's (never waited for here)
        if self._w().send is not None and self.has_connector_metadata():
            self._w().end_step(self._meta())

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        if self._w().recv is None:
            return KVConnectorTransferResults()
        finished, failed = self._w().results()
        return KVConnectorTransferResults(finished_recving=finished, failed_recving=failed)

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        sent = self._w().take_sent_bytes() if self._w().send is not None else {}
        wire = self._w().take_received_wire_bytes() if self._w().recv is not None else {}
        return PrfaasWorkerMeta(sent, wire) if sent or wire else None

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
