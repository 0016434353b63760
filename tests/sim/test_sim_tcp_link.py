"""RTT and loss on the inter-cluster link, in the planner and the simulator, and the shipped
public-internet scenario."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from prfaas.core.errors import ConfigError
from prfaas.models.tcp import TcpPath
from prfaas.planner.search import inputs_from_scenario, plan_all
from prfaas.scenario import Scenario, load_scenario
from prfaas.sim.policy_run import run_policy
from prfaas.sim.run import simulate
from prfaas.sim.system import build_system
from prfaas.workload.requests import Workload

SCENARIOS = Path(__file__).parents[2] / "src/prfaas/data/scenarios"


def variant(tmp_path: Path, base: str = "paper-case-study", **link: object) -> Scenario:
    raw = yaml.safe_load((SCENARIOS / f"{base}.yaml").read_text())
    raw["link"].update(link)
    raw.pop("reference", None)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_scenario(str(path))


def one_long(at_s: float = 0.0) -> Workload:
    return Workload(np.array([at_s]), np.array([60_000]), np.array([16]), "one long")


def test_rtt_adds_to_remote_ttft_in_plan_and_simulation(tmp_path: Path) -> None:
    base, rtt = load_scenario("paper-case-study"), variant(tmp_path, rtt_ms=30.0)
    plan0, plan1 = (plan_all(s, "exact").systems["prfaas_pd"] for s in (base, rtt))
    assert plan1.threshold_tokens == plan0.threshold_tokens  # throughput does not move
    assert plan1.lambda_max == plan0.lambda_max
    p = base.lengths.prob_above(plan0.threshold_tokens or 0)
    assert plan1.ttft_mean_s == pytest.approx(plan0.ttft_mean_s + 0.030 * p, rel=1e-9)
    sims = [simulate(build_system(s, "prfaas_pd"), one_long())[0] for s in (base, rtt)]
    assert sims[0].log.remote[0] and sims[1].log.remote[0]
    assert sims[1].log.kv_ready_s[0] - sims[0].log.kv_ready_s[0] == pytest.approx(0.030)


def test_loss_caps_one_transfer_by_mathis_and_the_planner_link(tmp_path: Path) -> None:
    # 1% loss at 30 ms: one connection carries 1.2247*1448*8/(0.03*0.1) = 4.73 Mbps; 100 of them
    lossy = variant(tmp_path, rtt_ms=30.0, loss=0.01, connections=100, pipelined=False)
    cap = TcpPath(30.0, 0.01, 100).transfer_cap_gbps()
    assert cap == pytest.approx(0.473, rel=1e-3)
    assert inputs_from_scenario(lossy).link_gbps == pytest.approx(cap)
    cfg = build_system(lossy, "prfaas_pd", threshold_tokens=1000)  # the long one goes remote
    assert cfg.flow_cap_gbps == pytest.approx(cap)
    sim = simulate(cfg, one_long())[0]
    log = sim.log
    assert log.remote[0]
    transfer_s = log.kv_ready_s[0] - log.prefill_end_s[0]  # not pipelined: after the prefill
    assert transfer_s == pytest.approx(log.kv_bytes[0] * 8 / (cap * 1e9) + 0.030, rel=1e-9)


def conversations(n: int = 60) -> Workload:
    """Conversations of 6 turns, 20 s apart, each turn reusing the earlier turns' blocks and
    adding 2 or 16 blocks of 512 tokens (long turns go remote and need the local prefix)."""
    arrival, inputs, hashes = [], [], []
    for i in range(n):
        conv, turn = divmod(i, 6)
        blocks = tuple(conv * 1000 + b for b in range(sum((2, 16)[k % 2]
                                                          for k in range(turn + 1))))
        arrival.append(i * 20.0)
        inputs.append(len(blocks) * 512)
        hashes.append(blocks)
    return Workload(np.asarray(arrival, float), np.asarray(inputs, np.int64),
                    np.full(n, 64, np.int64), "conversations", tuple(hashes))


def test_prefix_moves_wait_one_rtt_too(tmp_path: Path) -> None:
    runs = [run_policy(variant(tmp_path, "mooncake-conversation", rtt_ms=rtt), "prfaas_pd",
                       "cache-aware", conversations(), cache_scope="cluster",
                       threshold_tokens=3_000)[1] for rtt in (0.0, 5.0, 50.0)]
    for s in runs:
        assert s["completed"] == s["requests"]
    assert runs[1]["prefix_moves"] == runs[0]["prefix_moves"] > 0
    # every request here crosses the link once (its KV, or the prefix it waits for): +5 ms
    assert runs[1]["ttft_s"]["mean"] - runs[0]["ttft_s"]["mean"] == pytest.approx(0.005, 0.01)
    # at 50 ms a move costs more than the prefill it saves (view.kv_transfer_s counts the RTT)
    assert runs[2]["prefix_moves"] == 0


def test_defaults_leave_link_and_plan_untouched() -> None:
    s = load_scenario("paper-case-study")
    assert s.tcp == TcpPath() and inputs_from_scenario(s).link_gbps == 100.0
    assert build_system(s, "prfaas_pd").rtt_s == 0.0
    assert "rtt_s" not in build_system(s, "prfaas_pd").describe()


@pytest.mark.parametrize("key,value", [("rtt_ms", -5), ("loss", 1.5), ("connections", 0),
                                       ("mss_bytes", "big")])
def test_bad_link_terms_name_the_key(tmp_path: Path, key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        variant(tmp_path, **{key: value})


def test_public_internet_scenario_reproduces_the_measured_flows() -> None:
    s = load_scenario("public-internet")
    one = TcpPath(s.tcp.rtt_ms, s.tcp.loss, 1, s.tcp.mss_bytes)
    assert one.effective_gbps(s.link_gbps) == pytest.approx(14.7, rel=2e-3)  # a single flow
    assert s.tcp.effective_gbps(s.link_gbps) == pytest.approx(1.4 * 14.7, rel=1e-3)  # 8 conns
    assert s.tcp.rtt_ms == 29.75
    cfg = build_system(s, "prfaas_pd")
    gbps = np.array(cfg.link.gbps)
    assert gbps.min() == pytest.approx(0.85 * 20.58, rel=1e-3)  # +-15% over the day
    assert gbps.max() == pytest.approx(1.15 * 20.58, rel=1e-3)
    assert cfg.link.start_s[-1] == 23 * 3600
