"""Certificates for the security tests: one topology CA and a foreign CA, in temp dirs."""

from __future__ import annotations

import pytest
from security_helpers import Certs

from prfaas.security.certs import Authority, Member, init_certs

MEMBERS = ("router", "prfaas-0", "pdp-0", "pdd-0", "stranger")


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("certs")
    init_certs([Member(n) for n in MEMBERS], root / "topology")
    other = Authority("some other CA")
    other.write_ca(root / "foreign")
    other.write_member(root / "foreign", Member("prfaas-0"))  # right name, wrong CA
    return Certs(root / "topology", root / "foreign")
