"""Who may call an RPC server: the per-application secret, call signatures, TLS material.

Every call carries, ahead of its payload, the time it was signed and an HMAC-SHA256 over the
method, that time and the payload, keyed with the application's secret (:class:`RpcSecurity`).
A server checks it before it reads a byte of the payload (:meth:`RpcSecurity.check`); its reply
starts with an HMAC bound to the request's, which the client checks before decoding the reply.
(In the bytes rather than in gRPC metadata: a metadata round trip cost a fifth more per call.)  A signature
older or newer than ``max_skew_s`` is refused, which bounds how long a call captured on an
unencrypted network can be replayed; TLS (:class:`TlsMaterial`) closes that and hides the data.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MAC_SIZE", "STAMP_SIZE", "Refusals", "RpcSecurity", "TlsError", "TlsMaterial", "load_pem"]

log = logging.getLogger(__name__)

_TIME = struct.Struct(">d")
STAMP_SIZE = _TIME.size
MAC_SIZE = 32  # HMAC-SHA256


class TlsError(ValueError):
    """A certificate or key file that cannot be used."""


def load_pem(path: str | Path, what: str, marker: str) -> bytes:
    """The PEM file at ``path``, checked to hold a ``... <marker>-----`` block (e.g. ``CERTIFICATE``,
    ``PRIVATE KEY``, which also matches ``RSA PRIVATE KEY``)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if f"{marker}-----".encode() not in data:
        raise TlsError(f"{path} holds no PEM {marker.lower()} (the {what} must be PEM-encoded)")
    return data


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes for mutual TLS on every channel: this process's chain and key, and the roots it
    trusts (peers present the same kind of chain).  ``server_name``: the name peers' certificates
    are checked against instead of the address dialled (one certificate for the whole cluster)."""

    cert_chain: bytes
    private_key: bytes = field(repr=False)
    trust: bytes
    server_name: str | None = None

    @classmethod
    def from_files(cls, cert_chain: str, private_key: str, trust: str | None = None,
                   server_name: str | None = None) -> TlsMaterial:
        chain = load_pem(cert_chain, "certificate chain", "CERTIFICATE")
        key = load_pem(private_key, "private key", "PRIVATE KEY")
        roots = load_pem(trust, "trusted certificates", "CERTIFICATE") if trust else chain
        return cls(chain, key, roots, server_name)


_KEYED: dict[bytes, hmac.HMAC] = {}  # secret -> an HMAC keyed with it, copied for each MAC


@dataclass(frozen=True)
class RpcSecurity:
    """The application's secret (never printed) and, when configured, its TLS material."""

    secret: bytes = field(repr=False)
    tls: TlsMaterial | None = None
    max_skew_s: float = 300.0

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise ValueError("an RPC secret has at least 16 bytes")

    @classmethod
    def generate(cls, tls: TlsMaterial | None = None) -> RpcSecurity:
        """A fresh random secret (the driver's, when Spark's ``spark.authenticate`` is off)."""
        return cls(secrets.token_bytes(32), tls)

    @classmethod
    def from_passphrase(cls, text: str, tls: TlsMaterial | None = None) -> RpcSecurity:
        """A secret derived from a configured passphrase (``spark.authenticate.secret``)."""
        return cls(hashlib.sha256(b"spark-replication-rpc\0" + text.encode()).digest(), tls)

    def sign(self, method: str, payload: bytes | memoryview, now: float | None = None) -> tuple[bytes, bytes]:
        """(time, mac) that precede ``payload`` in a call of ``method``."""
        stamp = _TIME.pack(time.time() if now is None else now)
        return stamp, self._mac(method.encode(), stamp, payload)

    def check(self, method: str, stamp: bytes | None, mac: bytes | None, payload: bytes | memoryview,
              now: float | None = None) -> str | None:
        """Why a call must be refused, or None when it is signed with this secret and fresh."""
        if not mac or not stamp:
            return "unsigned call"
        if len(stamp) != _TIME.size:
            return "malformed signature time"
        if not hmac.compare_digest(mac, self._mac(method.encode(), stamp, payload)):
            return "bad signature"
        (signed_at,) = _TIME.unpack(stamp)
        if abs((time.time() if now is None else now) - signed_at) > self.max_skew_s:
            return f"signature older or newer than {self.max_skew_s:g} s"
        return None

    def sign_reply(self, request_mac: bytes, reply: bytes | memoryview) -> bytes:
        return self._mac(b"reply", request_mac, reply)

    def check_reply(self, request_mac: bytes, mac: bytes | None, reply: bytes | memoryview) -> bool:
        return bool(mac) and hmac.compare_digest(mac, self.sign_reply(request_mac, reply))

    def _mac(self, *parts: bytes | memoryview) -> bytes:
        template = _KEYED.get(self.secret)
        if template is None:  # (keying HMAC hashes the secret's pads: once per secret, not per call)
            template = _KEYED[self.secret] = hmac.new(self.secret, digestmod=hashlib.sha256)
        h = template.copy()
        for part in parts:
            h.update(struct.pack(">Q", len(part)))
            h.update(part)
        return h.digest()


class Refusals:
    """Calls a server refused: counted, and logged once per calling host."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.count = 0
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def refuse(self, peer: str, method: str, reason: str) -> None:
        host = _host_of(peer)
        with self._lock:
            self.count += 1
            first = host not in self._seen
            self._seen.add(host)
        if first:
            log.warning("%s refused a %s call from %s: %s (further refusals from there are counted, not logged)",
                        self.server, method, host, reason)


def _host_of(peer: str) -> str:
    """``ipv4:1.2.3.4:567`` -> ``1.2.3.4``; ``ipv6:[::1]:567`` -> ``[::1]``."""
    rest = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer
    return rest.rsplit(":", 1)[0] if ":" in rest else rest
