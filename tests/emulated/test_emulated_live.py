"""A small emulated deployment end to end: real router, workers and KV transport, compute
from the scenario's profiles; outputs must be the KV-derived reference tokens."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tiny_scenario import write_scenario

from prfaas.bench.loadgen import run_load
from prfaas.bench.workload import BenchRequest
from prfaas.emulated.backend import emulated_config, emulated_engine
from prfaas.emulated.scales import Scales
from prfaas.emulated.topology import emulated_system
from prfaas.serve.deploy.launcher import Deployment

pytestmark = pytest.mark.timeout(300)
SCALES = Scales(time=0.5, bytes=1e-2, tokens=4, output=4)


def test_emulated_prfaas_pd_serves_exact_tokens_in_profile_time(tmp_path: Path) -> None:
    es = emulated_system(str(write_scenario(tmp_path)), "prfaas_pd", SCALES,
                         link_emulation="token-bucket")
    t = es.topology.policy_args["threshold_tokens"]
    reference = emulated_engine(es.topology.model, "prfaas")
    lengths = [40, t // 2, t + 200, 2 * t, 90, 3 * t]
    prompts = ["".join("abcdefghij"[(i * 7 + k) % 10] for i in range(n - 1))
               for k, n in enumerate(lengths)]
    out_tokens = es.scaled.scenario.output_tokens
    with Deployment(es.topology, start_timeout_s=240) as dep:
        results = asyncio.run(run_load(dep.url, emulated_config(es.scaled).name,
                                       [BenchRequest(p, out_tokens) for p in prompts],
                                       [0.3 * i for i in range(len(prompts))], timeout_s=120))
    hw = {"prfaas": es.scaled.scenario.prfaas.hardware, "pd": es.scaled.scenario.pd.hardware}
    for n, prompt, r in zip(lengths, prompts, results, strict=True):
        assert r.ok, r.error
        ids = reference.tokenizer.encode(prompt)
        assert len(ids) == n
        assert r.prfaas["token_ids"] == reference.generate(ids, out_tokens)
        route = r.prfaas["route"]
        assert route == ("prfaas" if n > t else "pd")
        prefill_s = hw[route].require_prefill().seconds(n)
        assert r.prfaas["prefill_s"] >= 0.95 * prefill_s  # the sleep really happened
        assert r.ttft_s is not None and r.ttft_s >= prefill_s
        # "ready" of the capacity searches: the decoder held the KV after the prefill's sleep
        # and before the client saw the first token (one host, one wall clock)
        kv_ready = r.prfaas["kv_ready_unix_s"] - r.sent_unix_s
        assert 0.95 * prefill_s <= kv_ready <= r.ttft_s
        # decode: out_tokens - 1 steps of the decode profile's step (batch of <= 2 here)
        step = hw["pd"].require_decode().step_at(1)
        assert r.e2e_s is not None and r.e2e_s - r.ttft_s >= 0.9 * (out_tokens - 1) * step
        if route == "prfaas":
            assert r.prfaas["kv_bytes"] >= es.scaled.layout.size_bytes(n)
