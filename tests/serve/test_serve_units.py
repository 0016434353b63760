"""In-process pieces of serving: topology validation, OpenAI parsing, the worker prefix store,
KV reframing, metrics text, bench workloads. No processes, no sockets."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from serve_helpers import MODEL, topology

from prfaas.bench.workload import Scaling, from_mooncake_row, poisson_arrivals, synthetic
from prfaas.core.errors import ConfigError
from prfaas.core.types import RouteDecision
from prfaas.engine import ByteTokenizer
from prfaas.policy.base import Router
from prfaas.serve.engines import engine_backend
from prfaas.serve.router.cluster import LiveCluster
from prfaas.serve.router.dispatch import Dispatcher
from prfaas.serve.router.metrics import RouterMetrics
from prfaas.serve.router.openai_api import ApiError, load_json, parse
from prfaas.serve.router.service import RouterService
from prfaas.serve.stops import StopText
from prfaas.serve.topology import load_topology, parse_topology
from prfaas.serve.worker.kvship import reframe
from prfaas.serve.worker.prefix_store import PrefixStore

TOK = ByteTokenizer()


def test_embedded_local_topology_matches_the_issue() -> None:
    topo = load_topology()
    assert topo.policy == "prfaas-threshold" and topo.policy_args == {"threshold_tokens": 1024}
    assert {w.role for w in topo.workers} == {"prfaas", "pd-p", "pd-d"}
    assert topo.link.rate_gbps is not None and topo.intra_link.rate_gbps is None
    resolved = topology().with_ports()
    ports = [w.port for w in resolved.workers] + [resolved.router_port]
    assert all(ports) and len(set(ports)) == len(ports)


@pytest.mark.parametrize(("raw", "field"), [
    ({"workers": [{"name": "a", "role": "pd-p"}]}, "workers"),  # no decoder
    ({"workers": [{"name": "a", "role": "gpu"}]}, "workers.a.role"),
    ({"workers": [{"name": "d", "role": "pd-d"}], "bogus": 1}, "topology"),
    ({"workers": [{"name": "d", "role": "pd-d"}, {"name": "p", "role": "pd-p"}],
      "link": {"rate_gbps": -1}}, "link.rate_gbps"),
])
def test_bad_topology_names_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_topology(raw)
    assert info.value.field == field


def _parse(body: dict[str, Any], chat: bool = False) -> Any:
    return parse(body, chat, MODEL, 16384, TOK)


def test_parse_completion_and_chat() -> None:
    req = _parse({"model": MODEL, "prompt": "hi", "max_tokens": 3, "temperature": 0})
    assert req.token_ids == [256, 104, 105] and req.max_tokens == 3 and req.temperature == 0
    chat = _parse({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, chat=True)
    assert TOK.decode(chat.token_ids) == "<|user|>\nhi\n<|assistant|>\n"
    edge = _parse({"model": MODEL, "prompt": "x" * 16382, "max_tokens": 2})
    assert len(edge.token_ids) + edge.max_tokens == 16385  # generate's limit: context + 1


@pytest.mark.parametrize(("body", "param"), [
    ({"model": MODEL}, "prompt"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 1.5}, "max_tokens"),
    ({"model": MODEL, "prompt": "x" * 16382, "max_tokens": 3}, "max_tokens"),
    ({"model": MODEL, "prompt": "x" * 16384}, "prompt"),
    ({"model": "other", "prompt": "x"}, "model"),
    ({"model": MODEL, "prompt": "x", "n": 0}, "n"),
    ({"model": MODEL, "prompt": "x", "temperature": 9}, "temperature"),
    ({"model": MODEL, "prompt": [1, 999]}, "prompt"),
])
def test_parse_rejects_with_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        _parse(body)
    assert info.value.status == 400 and info.value.param == param
    assert info.value.body()["error"]["type"] == "invalid_request_error"


def test_malformed_json() -> None:
    with pytest.raises(ApiError) as info:
        load_json(b'{"model": ')
    assert info.value.code == "invalid_json"


def test_text_stream_keeps_multibyte_characters_whole() -> None:
    stream = StopText()
    deltas = [stream.feed(b) for b in "é€".encode()] + [stream.feed(257), stream.flush()]
    assert "".join(deltas) == "é€" and deltas[0] == ""


def test_prefix_store_longest_hit_lru_and_deltas(engine: Any) -> None:
    store = PrefixStore(64, capacity_bytes=10**9)
    ids = TOK.encode("p" * 200)  # 201 tokens: 3 full blocks
    kv = engine.prefill(ids).kv
    delta = store.insert(kv, ids)
    assert len(delta.inserted) == 3 and not delta.evicted
    assert store.insert(kv, ids).inserted == []  # a duplicate costs nothing
    hit = store.lookup(ids[:150] + [1] * 60, max_tokens=209)
    assert hit is not None and hit.num_tokens == 128
    assert store.lookup(ids, max_tokens=100).num_tokens == 64  # type: ignore[union-attr]
    assert store.lookup(TOK.encode("q" * 200), 200) is None
    small = PrefixStore(64, capacity_bytes=kv.snapshot_at(192).held_bytes() + 1)
    small.insert(kv, ids)
    other = engine.prefill(TOK.encode("z" * 100)).kv
    delta = small.insert(other, TOK.encode("z" * 100))
    assert len(delta.inserted) == 1 and len(delta.evicted) == 3  # LRU entry dropped


def test_reframe_ships_exactly_what_the_decoder_lacks(engine: Any) -> None:
    ids = TOK.encode("r" * 300)
    full = engine.prefill(ids).kv
    prefix = full.snapshot_at(128)
    got: list[Any] = []
    engine.prefill(ids, prefix=prefix, on_layer=got.append)
    mla = next(layer for layer in got if layer.kind == "mla")
    assert mla.start_token == 128
    wider = reframe(mla, 64, prefix)  # decoder holds 64: prepend [64, 128) from the cache
    narrower = reframe(mla, 192, prefix)  # decoder holds 192: cut
    truth = full.export_layer(mla.layer_index, 64, len(ids))
    for name, t in truth.tensors.items():
        assert torch.equal(wider.tensors[name], t)
        assert torch.equal(narrower.tensors[name], t[128:])
    assert (wider.start_token, narrower.start_token) == (64, 192)


def test_metrics_text_has_histograms_and_labels() -> None:
    m = RouterMetrics()
    m.ttft.observe(0.3)
    m.requests.inc(route="prfaas", outcome="ok")
    m.threshold.set(1024)
    text = m.render()
    assert 'prfaas_ttft_seconds_bucket{le="0.5"} 1' in text
    assert 'prfaas_ttft_seconds_bucket{le="0.25"} 0' in text
    assert 'prfaas_requests_total{outcome="ok",route="prfaas"} 1.0' in text
    assert "prfaas_threshold_tokens 1024" in text


def test_trace_rows_share_real_prefixes_and_scale() -> None:
    scaling = Scaling(length_scale=0.1, max_output_tokens=32)
    a = from_mooncake_row({"input_length": 2000, "output_length": 500,
                           "hash_ids": [0, 1, 2, 3]}, scaling)
    b = from_mooncake_row({"input_length": 1500, "output_length": 5,
                           "hash_ids": [0, 1, 9]}, scaling)
    assert len(a.prompt) + 1 == 200 and a.max_tokens == 32 and b.max_tokens == 1
    shared = 2 * round(512 * 0.1)
    assert a.prompt[:shared] == b.prompt[:shared] and a.prompt[shared] != b.prompt[shared]
    assert synthetic(5, scaling) == synthetic(5, scaling)
    times = poisson_arrivals(2.0, 50.0, seed=1)
    assert times == sorted(times) and 70 < len(times) < 130


def test_policy_rejection_is_429() -> None:
    class Reject(Router):
        name = "reject-all"

        def route(self, query: Any, view: Any) -> RouteDecision:
            return RouteDecision.reject("overloaded", 7)

    service = RouterService(topology(), policy=Reject())
    dispatcher = Dispatcher(service.topology, service.cluster, service.manager, service.policy,
                            None, 64)  # type: ignore[arg-type]  # never reaches a worker
    req = _parse({"model": MODEL, "prompt": "x"})
    with pytest.raises(ApiError) as info:
        dispatcher.route(req, "r1")
    assert info.value.status == 429 and "overloaded" in info.value.message


def test_without_a_cost_model_the_router_learns_seconds_per_token() -> None:
    topo = topology()
    backend = engine_backend(topo)
    assert backend.prefill_models() == {}  # the torch engine: no profile to predict with
    cluster = LiveCluster(topo, backend.card().kv)
    cluster.measured("pdp-0", 0.5, 1200, 200)  # 0.5 s for 1000 computed tokens
    assert cluster.prefill_time_s("pdp-0", 2000, 0) == pytest.approx(2000 * 0.5 / 1000)
    assert cluster.prefill_time_s("pdp-0", 2000, 1000) == pytest.approx(0.5)


def _scrape(service: RouterService) -> dict[str, float]:
    """The router's /metrics as {series: value} (what Prometheus would store)."""
    out = {}
    for line in service.metrics.render(service._refresh_gauges).splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def test_metrics_show_the_link_the_plan_and_failed_attempts() -> None:
    topo = topology(plan={"offload_fraction": 0.3, "link_gbps": 1.0})
    assert parse_topology(topo.to_dict()).plan == topo.plan  # as the launcher hands it on
    service = RouterService(topo)
    m = _scrape(service)
    assert m["prfaas_link_up"] == 1.0 and m["prfaas_plan_offload_fraction"] == 0.3
    assert m["prfaas_link_planned_gbps"] == 1.0  # plan.link_gbps before link.rate_gbps
    assert m["prfaas_link_capacity_gbps"] == 0.5  # no telemetry yet: the emulated rate
    # series exist at 0 before any request, so ratios of rates are 0, not missing
    assert m['prfaas_requests_total{outcome="ok",route="prfaas"}'] == 0.0
    assert m['prfaas_attempt_failures_total{route="prfaas"}'] == 0.0
    assert m["prfaas_retries_total"] == 0.0 and m["prfaas_resumes_total"] == 0.0
    assert not any(s.startswith("prfaas_threshold_limit_tokens") for s in m)  # fixed t
    service.membership.states["pdp-0"].up = False  # a local worker: the link is still up
    assert _scrape(service)["prfaas_link_up"] == 1.0
    service.membership.states["prfaas-0"].up = False  # the only PrfaaS worker unreachable
    service.cluster.capacity_gbps = 0.2  # link telemetry (POST /link)
    m = _scrape(service)
    assert m["prfaas_link_up"] == 0.0 and m["prfaas_link_capacity_gbps"] == 0.2
    bare = _scrape(RouterService(topology(link={"rate_gbps": None})))  # a real, unshaped link
    assert "prfaas_link_planned_gbps" not in bare and "prfaas_link_capacity_gbps" not in bare
    assert "prfaas_plan_offload_fraction" not in bare


@pytest.mark.parametrize(("plan", "field"), [({"offload_fraction": 1.5}, "plan.offload_fraction"),
                                             ({"link_gbps": 0}, "plan.link_gbps"),
                                             ({"offload_fraction": "most"},
                                              "plan.offload_fraction"),
                                             ({"threshold": 1}, "plan")])
def test_a_bad_plan_names_its_field(plan: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        topology(plan=plan)
