"""TLS contexts from a topology's certificate folder, every file checked before use.

`Identity.load(dir, name)` reads DIR/ca.pem, DIR/NAME.pem and DIR/NAME.key and refuses, with a
ConfigError naming the file, one that is missing or unreadable, not PEM, expired (or not yet
valid), or a key that does not match its certificate. Contexts are mutual TLS 1.3 only: a
server requires a client certificate from the same CA; a client verifies the server's chain and
its name (callers pass the peer's topology name as server_hostname: every certificate carries
its name as a DNS subjectAltName). These contexts are built once per process and handed to the
transport and to aiohttp; nothing below builds its own.
"""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from prfaas.core.errors import ConfigError

_SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _read(path: Path, what: str) -> bytes:
    if not path.exists():
        raise ConfigError(what, str(path), "no such file (run `prfaas certs init`)")
    if not path.is_file():
        raise ConfigError(what, str(path), "unreadable: not a regular file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(what, str(path), f"unreadable: {exc.strerror or exc}") from exc


def _certificate(path: Path, what: str, now: dt.datetime) -> x509.Certificate:
    raw = _read(path, what)  # (a ConfigError is a ValueError: read outside the try)
    try:
        cert = x509.load_pem_x509_certificate(raw)
    except ValueError as exc:
        raise ConfigError(what, str(path), f"not a PEM certificate: {exc}") from exc
    if cert.not_valid_after_utc < now:
        raise ConfigError(what, str(path), f"expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} "
                          "UTC")
    if cert.not_valid_before_utc > now:
        raise ConfigError(what, str(path), f"not valid before "
                          f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    return cert


def _check_key(key_path: Path, cert: x509.Certificate, cert_path: Path) -> None:
    raw = _read(key_path, "tls.key")
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError("tls.key", str(key_path), f"not an unencrypted PEM key: {exc}") from exc
    if key.public_key().public_bytes(*_SPKI) != cert.public_key().public_bytes(*_SPKI):
        raise ConfigError("tls.key", str(key_path), f"does not match certificate {cert_path}")


@dataclass(frozen=True, slots=True)
class Identity:
    """One member's CA + certificate + key, checked."""

    name: str
    ca_path: Path
    cert_path: Path
    key_path: Path

    @classmethod
    def load(cls, folder: str | Path, name: str, now: dt.datetime | None = None) -> Identity:
        d = Path(folder)
        now = now or dt.datetime.now(dt.UTC)
        ident = cls(name, d / "ca.pem", d / f"{name}.pem", d / f"{name}.key")
        _certificate(ident.ca_path, "tls.ca", now)
        cert = _certificate(ident.cert_path, "tls.cert", now)
        _check_key(ident.key_path, cert, ident.cert_path)
        return ident

    def server_context(self) -> ssl.SSLContext:
        ctx = self._context(ssl.PROTOCOL_TLS_SERVER)
        ctx.verify_mode = ssl.CERT_REQUIRED  # mutual: no client certificate, no connection
        ctx.num_tickets = 0  # no resumption: every connection shows its certificate
        return ctx

    def client_context(self) -> ssl.SSLContext:
        return self._context(ssl.PROTOCOL_TLS_CLIENT)  # verifies chain and hostname

    def _context(self, protocol: int) -> ssl.SSLContext:
        ctx = ssl.SSLContext(protocol)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        try:
            ctx.load_verify_locations(cafile=str(self.ca_path))
            ctx.load_cert_chain(str(self.cert_path), str(self.key_path))
        except ssl.SSLError as exc:
            raise ConfigError("tls.cert", str(self.cert_path), f"rejected by OpenSSL: {exc}"
                              ) from exc
        return ctx


def server_context_for(folder: str | Path, name: str) -> ssl.SSLContext:
    """Picklable recipe (with functools.partial) for a child process to build its context."""
    return Identity.load(folder, name).server_context()
