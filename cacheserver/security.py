"""Who may talk to the daemon: TLS material, the bearer token, loopback checks.

Everything is read and checked at start, so a missing, unreadable or malformed
file stops the daemon with a message naming the flag and the file, instead of
failing every handshake later.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from client.wire import plane

log = logging.getLogger(__name__)


class SecurityConfigError(ValueError):
    """A TLS or token file is missing, unreadable or not what it should be."""


def _read(flag: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"cannot read {flag} {path}: {exc.strerror}") from None


def _certificates(flag: str, path: Path) -> bytes:
    pem = _read(flag, path)
    try:
        x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise SecurityConfigError(
            f"{flag} {path} holds no PEM certificate ({exc}); pass a "
            "file starting with -----BEGIN CERTIFICATE-----"
        ) from None
    return pem


@dataclass(frozen=True)
class TlsMaterial:
    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )

    def server_context(self) -> ssl.SSLContext:
        """The same certificate, key and client CA for the data port (cacheserver/plane)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        plane.load_cert_chain(context, self.cert_chain, self.private_key)
        if self.client_ca is not None:
            context.load_verify_locations(cadata=self.client_ca.decode())
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def load_tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> TlsMaterial | None:
    """Read and check --tls-cert/--tls-key/--tls-client-ca; None when TLS is off."""
    if cert is None and key is None:
        if client_ca is not None:
            raise SecurityConfigError(
                "--tls-client-ca needs --tls-cert and --tls-key: mutual "
                "TLS is TLS with client certificates"
            )
        return None
    if cert is None or key is None:
        missing = "--tls-key" if key is None else "--tls-cert"
        raise SecurityConfigError(f"TLS needs both --tls-cert and --tls-key; {missing} is missing")
    chain = _certificates("--tls-cert", cert)
    key_pem = _read("--tls-key", key)
    try:
        load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise SecurityConfigError(
            f"--tls-key {key} holds no unencrypted PEM private key ({exc})"
        ) from None
    ca = _certificates("--tls-client-ca", client_ca) if client_ca is not None else None
    return TlsMaterial(chain, key_pem, ca)


def load_token(path: Path | None, flag: str = "--auth-token-file") -> bytes | None:
    """The bearer token in path (surrounding whitespace stripped); None when off."""
    if path is None:
        return None
    token = _read(flag, path).strip()
    if not token:
        raise SecurityConfigError(
            f"{flag} {path} is empty; write a random token "
            "into it, e.g. `openssl rand -hex 32 > FILE`"
        )
    if any(c < 0x21 or c > 0x7E for c in token):
        raise SecurityConfigError(
            f"{flag} {path}: the token must be printable "
            "ASCII without spaces (it travels in a header)"
        )
    return token


def peer_ip(peer: str) -> str:
    """The IP address of a gRPC peer ("ipv4:10.0.0.5:4321", "ipv6:[::1]:4321") or of a
    socket's getpeername() host, normalized (an IPv4-mapped IPv6 address as IPv4); ""
    for a unix socket or anything else."""
    if peer.startswith(("ipv4:", "ipv6:")):
        peer = urllib.parse.unquote(peer.split(":", 1)[1]).rsplit(":", 1)[0].strip("[]")
    try:
        ip = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return ""
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(address: str, tls: bool) -> None:
    """Warn when a TCP address is reachable from other hosts without TLS."""
    if address.startswith("unix:") or tls:
        return
    host = address.rpartition(":")[0]
    if not is_loopback(host):
        log.warning(
            "listening on %s without TLS: anyone who can reach this address can read "
            "and write caches in clear text; pass --tls-cert/--tls-key (and "
            "--auth-token-file) or bind 127.0.0.1",
            address,
        )
