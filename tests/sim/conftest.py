"""Fixtures the simulator's tests share: the paper's case study and its planned PrfaaS-PD
system (both read-only, built once per module)."""

import pytest

from prfaas.scenario import Scenario, load_scenario
from prfaas.sim.system import SystemConfig, build_system


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return load_scenario("paper-case-study")


@pytest.fixture(scope="module")
def cfg(scenario: Scenario) -> SystemConfig:
    return build_system(scenario, "prfaas_pd")
