"""Two PD clusters sharing one PrfaaS cluster, live (experiments/regions_live.py): each region's
router, its own kernel-shaped link into the PrfaaS namespace, the tenant gateway. The
mechanism at small scale (the 60 s partition and the fairness figures are
benchmarks/bench_regions_live.py's): one region's link cut carries no KV while the other
region's keeps crossing and every request of both completes; per-tenant and per-destination
metrics, each destination's bytes metered at its own link; what the cut caught in flight; a
prefill without a tenant key is refused."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from tiny_regions import write_regions

from needs import needs
from prfaas.emulated.scales import Scales
from prfaas.experiments.regions_live import (
    RegionRun,
    RegionsSetup,
    gateway_status,
    in_flight_at_cut,
    regions_setup,
    run_live,
)
from prfaas.serve.deploy.netns import namespaces
from prfaas.serve.deploy.regions import RegionsDeployment

pytestmark = needs("netns")  # one netns veth per region

SCALES = Scales(time=0.5, bytes=1e-2, tokens=4, output=4)
CUT = "east"  # the region that offloads about half its requests (west: ~8%)
T_CUT_S, T_HEAL_S, END_S = 4.0, 9.0, 14.0  # live seconds
MARGIN_S = 0.5  # the `ip link set down` command's own time


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[RegionsSetup, RegionsDeployment, dict[str, RegionRun], dict[str,
                                                                                      Any]]]:
    folder = tmp_path_factory.mktemp("regions")
    setup = regions_setup(str(write_regions(folder)), SCALES)
    before = set(namespaces())
    with setup.deployment(folder / "logs") as dep:
        rates = {k: 0.6 * v for k, v in setup.planned_rps().items()}
        work = setup.workloads(rates, END_S / SCALES.time, seed=3)
        marks: dict[str, Any] = {}

        def cut() -> None:
            dep.partition(CUT, True)
            marks["at_cut"] = gateway_status(dep, "west")

        runs = run_live(setup, dep, work, 3, [
            (T_CUT_S, cut), (T_HEAL_S, lambda: dep.partition(CUT, False))])
        time.sleep(1.5 * setup.gateway.meter_interval_s)  # the link meter reads once more
        with urllib.request.urlopen(f"{dep.gateway_url('west')}/metrics", timeout=10) as r:
            marks["metrics"] = r.read().decode()
        try:
            urllib.request.urlopen(urllib.request.Request(
                f"{dep.gateway_url('west')}/prefill", data=b'{"token_ids": [1]}',
                method="POST"), timeout=10)
            marks["no_key_status"] = 200
        except urllib.error.HTTPError as exc:
            marks["no_key_status"] = exc.code
        yield setup, dep, runs, marks
    assert set(namespaces()) <= before  # the namespace and its veths are gone


def _remote_ready_in(run: RegionRun, lo_s: float, hi_s: float) -> int:
    """Requests prefilled on the PrfaaS cluster whose KV reached the decoder in [lo, hi)."""
    return int((run.remote & (run.ready_s >= lo_s) & (run.ready_s < hi_s)).sum())


def test_a_cut_link_carries_no_kv_and_the_other_region_keeps_crossing(live: Any) -> None:
    _, _, runs, _ = live
    cut, other = runs[CUT], runs["west"]
    during = (T_CUT_S + MARGIN_S, T_HEAL_S)
    assert _remote_ready_in(cut, *during) == 0
    # the same count is not zero where KV does cross: before the cut (the negative control)
    assert _remote_ready_in(cut, 0.0, T_CUT_S) > 0
    assert _remote_ready_in(cut, T_HEAL_S, np.inf) > 0  # and again after it heals
    # every request of both regions completes: the cut region's through its PD-P (retries)
    for name, run in runs.items():
        assert run.ok.all(), (name, run.errors)
    sent_during = (other.arrival_s >= during[0]) & (other.arrival_s < during[1])
    assert sent_during.sum() > 0 and other.ok[sent_during].all()


def test_gateway_exports_per_tenant_and_per_destination_metrics(live: Any) -> None:
    _, _, runs, marks = live
    text = marks["metrics"]
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    for tenant in ("east", "west"):
        assert f'prfaas_destination_egress_budget_gbps{{destination="{tenant}"}}' in values
    ok_east = values['prfaas_tenant_requests_total{outcome="ok",tenant="east"}']
    assert ok_east >= 1 and values['prfaas_destination_kv_bytes_total{destination="east"}'] > 0
    # what the gateway counted for east is what east's client saw go remote (final route)
    assert ok_east >= int(runs["east"].remote.sum())
    assert values["prfaas_tenant_uncached_tokens_total{tenant=\"east\"}"] > 0


def test_the_routers_carry_their_keys_and_a_keyless_prefill_is_refused(live: Any) -> None:
    _, _, runs, marks = live
    assert marks["no_key_status"] == 401
    assert runs[CUT].remote.any()  # the router's key was accepted (a remote prefill ran)


def test_each_destination_is_metered_at_its_own_link(live: Any) -> None:
    """The gateway reads each region's bytes at its own veth: at least the KV it reported for
    that region (headers come on top). Reading the other region's veth would fail for the
    region that offloads more (east: about half its requests, west: ~8%)."""
    _, _, _, marks = live
    values = {line.split(" ")[0]: float(line.split(" ")[1])
              for line in marks["metrics"].splitlines() if line and not line.startswith("#")}
    link = {t: values[f'prfaas_destination_link_bytes_total{{destination="{t}"}}']
            for t in ("east", "west")}
    kv = {t: values[f'prfaas_destination_kv_bytes_total{{destination="{t}"}}']
          for t in ("east", "west")}
    assert kv["east"] > kv["west"] > 0
    for t in ("east", "west"):
        assert link[t] >= kv[t], (t, link, kv)


def test_the_cut_records_what_it_caught_in_flight(live: Any) -> None:
    _, _, runs, marks = live
    caught = in_flight_at_cut(runs[CUT], T_CUT_S, marks["at_cut"], CUT)
    assert caught["gateway_running"] is not None and caught["gateway_transferring"] is not None
    assert caught["client_in_flight"] == caught["completed"] + caught["failed"]
    assert caught["completed_after_retry"] <= caught["completed"]
    assert caught["failed"] == 0  # every request completes (the test above)
