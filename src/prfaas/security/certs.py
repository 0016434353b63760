"""`prfaas certs init`: a private CA and one certificate per topology member.

Writes DIR/ca.pem (+ ca.key, mode 0600, to issue more later) and DIR/NAME.pem + DIR/NAME.key for
every worker and for `router`. Keys are ECDSA P-256 (fast handshakes); every certificate carries
its NAME as subject CN and first DNS subjectAltName (peers are identified by it, not by address:
a worker's host may change under netns), then its host as a further SAN for tools like curl.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from prfaas.core.errors import ConfigError

ROUTER = "router"
_PEM = serialization.Encoding.PEM


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    host: str = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Issued:
    name: str
    cert_path: Path
    key_path: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _san(member: Member) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = [x509.DNSName(member.name)]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(member.host)))
    except ValueError:
        if member.host != member.name:
            names.append(x509.DNSName(member.host))
    return x509.SubjectAlternativeName(names)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


class Authority:
    """A CA that signs member certificates (also used by tests to mint bad ones)."""

    def __init__(self, common_name: str = "prfaas topology CA", days: int = 365,
                 now: dt.datetime | None = None) -> None:
        self.key = _key()
        self.now = now or dt.datetime.now(dt.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        self.cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(self.now - dt.timedelta(minutes=5))
            .not_valid_after(self.now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(self.key, hashes.SHA256()))

    def issue(self, member: Member, days: int = 365, valid_from: dt.datetime | None = None
              ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = _key()
        start = valid_from or self.now - dt.timedelta(minutes=5)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, member.name)]))
            .issuer_name(self.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + dt.timedelta(days=days))
            .add_extension(_san(member), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(self.key, hashes.SHA256()))
        return cert, key

    def write_ca(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        (out / "ca.pem").write_bytes(self.cert.public_bytes(_PEM))
        _write_key(out / "ca.key", self.key)
        return out / "ca.pem"

    def write_member(self, out: Path, member: Member, days: int = 365,
                     valid_from: dt.datetime | None = None) -> Issued:
        cert, key = self.issue(member, days, valid_from)
        cert_path, key_path = out / f"{member.name}.pem", out / f"{member.name}.key"
        cert_path.write_bytes(cert.public_bytes(_PEM))
        _write_key(key_path, key)
        return Issued(member.name, cert_path, key_path)


def init_certs(members: Iterable[Member], out: str | Path, days: int = 365) -> list[Issued]:
    """A fresh CA in `out` and a certificate + key for every member (names must be unique)."""
    members = list(members)
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ConfigError("members", names, "names must be unique")
    for name in names:
        if not name or "/" in name or name.startswith("."):
            raise ConfigError("member name", name, "must be a plain file name")
    if days < 1:
        raise ConfigError("--days", days, "must be >= 1")
    out_dir = Path(out)
    try:
        ca = Authority(days=days)
        ca.write_ca(out_dir)
        return [ca.write_member(out_dir, m, days) for m in members]
    except OSError as exc:
        raise ConfigError("--out", str(out), f"cannot write: {exc.strerror or exc}") from exc
