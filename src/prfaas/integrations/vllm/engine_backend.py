"""The vLLM engine backend (`engine: vllm`): every worker is a vLLM server with the prfaas KV
connector; the router drives them over vLLM's OpenAI API (router_half.py) with the
served model's own tokenizer. Nothing here imports vLLM, transformers or torch."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from prfaas.cache.listener import PoolListener
from prfaas.core.errors import ConfigError
from prfaas.integrations.vllm.deploy import exec_worker, prepare, settings
from prfaas.integrations.vllm.kv_events import VllmKvEvents, endpoints
from prfaas.integrations.vllm.params import WIRE_DTYPES
from prfaas.integrations.vllm.served_model import ServedModel
from prfaas.models.card import ModelCard
from prfaas.models.kv import KVGeometry, geometry
from prfaas.models.kv_release import save_points_of
from prfaas.serve.engines import EngineBackend

if TYPE_CHECKING:
    from prfaas.serve.topology import Topology

# which measured KV's codec figures stand for an architecture (data/codec_speeds.json)
CODEC_KV_BY_ARCH = {"qwen3_next": "vllm_tiny_qwen3_next", "llama": "vllm_tiny_llama"}
START_TIMEOUT_S = 600.0  # vLLM instances take 35-200 s to start on a loaded 2-core host


class VllmEngineBackend(EngineBackend):
    name = "vllm"
    worker_protocol = "vllm"
    health_has_body = False  # vLLM's /health: 200 and an empty body
    start_timeout_s = START_TIMEOUT_S
    wire_dtypes = WIRE_DTYPES  # PrfaasConnector encodes fp8 (wire_quant.py)
    # the connector's SendLink keeps one ordered queue per destination (link.py): a transfer's
    # layers go out after every layer queued before them, so transfers cross one at a time
    link_order = "fifo"

    @classmethod
    def check(cls, topology: Topology) -> None:
        if topology.vllm is None:
            raise ConfigError("vllm", None, "workers with engine: vllm need a `vllm:` section")

    def _model(self) -> tuple[ServedModel, KVGeometry]:
        model = ServedModel.from_settings(settings(self.topology))
        return model, geometry(model.to_spec())

    def card(self) -> ModelCard:
        model, geo = self._model()
        return ModelCard(model.name, model.max_context_tokens, model.block_size_tokens, geo)

    def cache_dtype(self) -> str:
        # from the instances' arguments (no model files needed): bf16 on this CPU build
        return ServedModel.from_settings(settings(self.topology)).dtypes()[0]

    def codec_kv(self) -> str | None:
        # the tiny vLLM models measured in transport.json, by the topology's architecture (GDN
        # + attention: qwen3_next, attention only: llama); no model files needed, as for
        # cache_dtype: the router plans before `prfaas serve` has built the model
        return CODEC_KV_BY_ARCH.get(settings(self.topology).arch)

    def tokenizer(self) -> Any:
        return self._model()[0].tokenizer()

    def kv_release(self) -> dict[str, Any]:
        """vLLM prefills `max_num_batched_tokens` per step; PrfaasConnector saves a step's KV
        of each attention layer as that layer runs, and the GDN/Mamba conv and recurrent
        states after the prompt's last step (worker_half.py). Needs the model's config.json."""
        model, geo = self._model()
        wire = geo.on_wire(self.topology.link.wire_dtype)
        return {"chunk_tokens": int(settings(self.topology).max_num_batched_tokens),
                "state_bytes": float(wire.state_bytes),
                "save_points": [list(p) for p in save_points_of(model.layer_types())]}

    def worker_protocol_args(self) -> dict[str, Any]:
        model, geo = self._model()
        wire = geo.on_wire(self.topology.link.wire_dtype)  # what crosses the inter-DC link
        return {"served_name": model.name, "block_size_tokens": model.block_size_tokens,
                "kv_bytes_per_token": wire.kv_bytes_per_token,
                "kv_fixed_bytes": int(geo.linear_state_bytes),
                # with KV events the instances report their cache; no inference from requests
                "report_inserts": not settings(self.topology).kv_events}

    def cache_events(self, listener: PoolListener) -> VllmKvEvents | None:
        """With `vllm.kv_events`: the subscriber that feeds `listener` from every instance's
        KV events (kv_events.py); the router starts it."""
        if not settings(self.topology).kv_events:
            return None
        where = self.event_endpoints()
        model, _ = self._model()
        return VllmKvEvents(where, listener, model.block_size_tokens)

    def event_endpoints(self) -> dict[str, str]:
        """Where the router subscribes to each instance's KV events (kv_events.endpoints).
        Refused: TCP beside TLS, and an events folder another user could reach."""
        s, tls = settings(self.topology), self.topology.security.tls
        return {w.name: endpoints(w.name, w.host, w.events_port, s.events_dir, tls)[1]
                for w in self.topology.workers}

    def prepare(self) -> None:
        prepare(self.topology)

    def tokenizer_folder(self, out_dir: Path) -> Path:
        """The model directory's tokenizer files (the ones the vLLM instances and the router
        load), copied; the model is built first if missing."""
        prepare(self.topology)
        src = Path(settings(self.topology).model_dir)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        for name in names:
            if (src / name).is_file():
                shutil.copyfile(src / name, out / name)
        if not (out / "tokenizer.json").is_file():
            raise ConfigError("vllm.model.dir", str(src), "has no tokenizer.json")
        return out

    def launch_topology(self, local_workers: frozenset[str], run_dir: Path) -> Topology:
        """With KV events beside TLS and no `vllm.events_dir`: a private folder for the event
        sockets in `run_dir`, if every vLLM instance runs on this host (a unix socket does not
        cross hosts); otherwise refused, since vLLM's TCP publisher is unauthenticated."""
        s = settings(self.topology)
        if not (s.kv_events and self.topology.security.tls and s.events_dir is None):
            return self.topology
        away = [w.name for w in self.topology.workers
                if w.engine == "vllm" and w.name not in local_workers]
        if away:
            raise ConfigError("vllm.kv_events", True,
                              f"beside security.tls KV events go over unix sockets on the "
                              f"router's host, and {away[0]} runs elsewhere: turn kv_events "
                              f"off or run every vLLM instance on this host")
        folder = run_dir / "kv-events"
        folder.mkdir(mode=0o700)
        return dataclasses.replace(self.topology,
                                   vllm=dataclasses.replace(s, events_dir=str(folder)))

    def worker_engine(self, name: str) -> NoReturn:
        exec_worker(self.topology, name)  # this process becomes the vLLM server
        raise AssertionError("exec_worker returned")
