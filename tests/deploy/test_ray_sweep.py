"""`prfaas capacity --ray ADDRESS`: the probes run as Ray tasks (speculatively ahead), and the
JSON is exactly the local run's. A different seed changes the JSON (the comparison can fail).
Both wall times are printed (figures for docs/deploy.md come from a benchmark-free run of
the CLI; this test asserts equality only)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from prfaas.cli import main

pytestmark = pytest.mark.timeout(600)
ARGS = ["capacity", "--json", "--requests", "400", "--system", "prfaas_pd"]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    try:
        main(args)
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr()
    wall_s = time.perf_counter() - t0
    out, _ = capsys.readouterr()
    payload: dict[str, Any] = json.loads(out)
    return payload, wall_s


def test_capacity_on_ray_equals_local(ray_cluster: Any, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    local, local_s = _run(ARGS, capsys)
    on_ray, ray_s = _run([*ARGS, "--ray", ray_cluster.address], capsys)
    assert on_ray == local
    assert len(local["probes"]) >= 3 and local["max_rps"] > 0
    other, _ = _run([*ARGS, "--seed", "1"], capsys)
    assert other != local  # negative control: the equality above can fail
    with capsys.disabled():
        print(f"\ncapacity ({len(local['probes'])} probes of 400 requests): local {local_s:.1f} s,"
              f" on Ray {ray_s:.1f} s; max_rps {local['max_rps']}")
