"""Signed request/reply frames over one plain TCP (or TLS) connection per peer: the data plane's
transport.

A gRPC unary call cost about five times the CPU of the same signed bytes written to a socket and
answered on it (`bench/README.md`, *frames*): its client, its event engine and its server's
thread pool each take the GIL once per call, and the data plane makes hundreds of calls a second.
So batches between workers travel here, and gRPC (:mod:`transport.rpc`) keeps the control plane.

The security is :mod:`transport.rpc`'s, frame for frame: a server listens on one host only; every
request carries its signing time and an HMAC over the method, that time and the payload
(:class:`~transport.security.RpcSecurity`), checked before the handler sees a byte of it; a refused
request is counted (:class:`~transport.security.Refusals`), answered with an error and its
connection closed; every reply carries an HMAC bound to its request's, checked by the client; with
TLS material the server accepts mutual TLS only and the client dials TLS.  Frames::

    request: u32 length | stamp (8) | mac (32) | payload
    reply:   u32 length | u8 status | (status 0) mac (32) | reply
                                    | (status 1) why the call failed, UTF-8

A server runs one thread per open connection (a peer keeps one), up to ``max_connections``; a
connection that has not sent a signed frame within 10 s of opening is closed.  A
:class:`FramePeer` has one call in flight at a time, on a connection it opens again after a
failure.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from transport.rpc import host_port
from transport.security import MAC_SIZE, STAMP_SIZE, Refusals, RpcSecurity, TlsMaterial

__all__ = ["FrameCallFailed", "FramePeer", "FrameServer", "MAX_FRAME", "TransportFailure", "UnauthenticatedFrame"]

log = logging.getLogger(__name__)

MAX_FRAME = 64 * 1024 * 1024
_LENGTH = struct.Struct(">I")
_HEAD = STAMP_SIZE + MAC_SIZE
_OK, _FAILED = 0, 1
_FIRST_FRAME_TIMEOUT_S = 10.0


class TransportFailure(OSError):
    """The connection failed or timed out: the call may be sent again (the peer may have taken it)."""


class FrameCallFailed(RuntimeError):
    """The server answered that the call failed (refused, or its handler raised): not worth repeating."""


class UnauthenticatedFrame(FrameCallFailed):
    """A reply not signed with this application's secret: the server is not one of this job's."""


def _read_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("the connection closed")
        got += k
    return buf


def _read_frame(sock: socket.socket) -> bytearray:
    (length,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
    if length > MAX_FRAME:
        raise ValueError(f"a frame of {length} bytes (at most {MAX_FRAME})")
    return _read_exactly(sock, length)


def _tls_context(tls: TlsMaterial, server_side: bool) -> ssl.SSLContext:
    """Mutual TLS with ``tls``: this process's chain and key, peers checked against its roots."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory() as private:  # ssl loads a key from a file only; the directory is 0700
        chain, key = Path(private, "chain.pem"), Path(private, "key.pem")
        chain.write_bytes(tls.cert_chain)
        key.write_bytes(tls.private_key)
        ctx.load_cert_chain(chain, key)
    ctx.load_verify_locations(cadata=tls.trust.decode("ascii"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class FrameServer:
    """Answers signed ``method`` frames with ``handler`` (payload -> reply) on a free port of
    ``bind_host``.  ``refusals`` may be shared with the process's gRPC server (one count per worker)."""

    def __init__(self, method: str, handler: Callable[[bytes], bytes], *, security: RpcSecurity, bind_host: str,
                 max_connections: int, refusals: Refusals | None = None, name: str = "frame server") -> None:
        self.method, self._handler, self._security = method, handler, security
        self.refusals = refusals or Refusals(name)
        self._name = name
        self._max_connections = max_connections
        self._tls = _tls_context(security.tls, server_side=True) if security.tls is not None else None
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((bind_host.strip("[]"), 0))
            self._listener.listen(64)
        except OSError:
            self._listener.close()
            raise
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stopped = False
        threading.Thread(target=self._accept, name=f"frames-accept-{self.port}", daemon=True).start()

    @property
    def refused(self) -> int:
        return self.refusals.count

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._open)

    def _accept(self) -> None:
        while True:
            try:
                conn, addr = self._listener.accept()
            except OSError:
                return  # stopped
            with self._lock:
                if self._stopped or len(self._open) >= self._max_connections:
                    conn.close()
                    continue
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn, addr[0]), daemon=True,
                             name=f"frames-{addr[0]}:{addr[1]}").start()

    def _serve(self, conn: socket.socket, host: str) -> None:
        sock = conn
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(_FIRST_FRAME_TIMEOUT_S)  # until a signed frame came: strangers do not hold a slot
            if self._tls is not None:
                sock = self._tls.wrap_socket(conn, server_side=True)  # (takes over conn's descriptor)
                with self._lock:
                    self._open.discard(conn)
                    if self._stopped:
                        return
                    self._open.add(sock)
            while True:
                request = _read_frame(sock)
                reply, refused = self._answer(request, host)
                sock.sendall(reply)
                if refused:
                    return  # a stranger or a forger: no second try on this connection
                sock.settimeout(None)  # a peer's link: idle as long as it likes
        except ValueError as exc:
            self.refusals.refuse(host, self.method, str(exc))
        except OSError:
            return  # the peer went or failed the handshake (ssl.SSLError is an OSError)
        finally:
            with self._lock:
                self._open.discard(conn)
                self._open.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def _answer(self, request: bytearray, host: str) -> tuple[bytes, bool]:
        """The reply frame to ``request``, and whether it was refused."""
        view = memoryview(request)
        stamp, mac, payload = view[:STAMP_SIZE], view[STAMP_SIZE:_HEAD], view[_HEAD:]
        why = self._security.check(self.method, bytes(stamp), bytes(mac), payload) \
            if len(request) >= _HEAD else "unsigned call"
        if why is not None:
            self.refusals.refuse(host, self.method, why)
            return _failed(f"refused: {why}"), True
        try:
            reply = self._handler(bytes(payload))
        except Exception as exc:  # noqa: BLE001 - the caller hears why; the connection serves on
            log.warning("%s: a %s call failed: %s", self._name, self.method, exc)
            return _failed(f"{type(exc).__name__}: {exc}"), False
        body = bytes([_OK]) + self._security.sign_reply(bytes(mac), reply) + reply
        return _LENGTH.pack(len(body)) + body, False

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            conns = list(self._open)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # (wakes the accepting thread; a close alone may not)
        with contextlib.suppress(OSError):
            self._listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


def _failed(why: str) -> bytes:
    body = bytes([_FAILED]) + why.encode()
    return _LENGTH.pack(len(body)) + body


class FramePeer:
    """A client of one :class:`FrameServer`: :meth:`call` sends a payload and returns the reply."""

    def __init__(self, host: str, port: int, method: str, security: RpcSecurity) -> None:
        self.host, self.port, self.method = host.strip("[]"), port, method
        self._security = security
        self._tls = _tls_context(security.tls, server_side=False) if security.tls is not None else None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)

    def call(self, payload: bytes, timeout: float) -> bytes:
        """The signed reply to ``payload``.  Raises :class:`TransportFailure` when the connection
        failed (the call may have been taken), :class:`FrameCallFailed` when the server refused it
        or its handler failed, :class:`UnauthenticatedFrame` when the reply is not signed."""
        stamp, mac = self._security.sign(self.method, payload)
        with self._lock:
            try:
                sock = self._connected(timeout)
                sock.settimeout(timeout)
                sock.sendall(_LENGTH.pack(_HEAD + len(payload)) + stamp + mac + payload)
                reply = _read_frame(sock)
            except (OSError, ValueError) as exc:
                self._drop()
                raise TransportFailure(f"{self.method} to {self.address}: {exc}") from exc
        if not reply or reply[0] != _OK:
            if not reply or reply[0] != _FAILED:
                self._close_quietly()
                raise TransportFailure(f"{self.method} to {self.address}: a malformed reply")
            self._close_quietly()  # (a refused call's connection is closed by the server)
            raise FrameCallFailed(f"{self.method} to {self.address}: {bytes(reply[1:]).decode(errors='replace')}")
        view = memoryview(reply)
        if len(reply) < 1 + MAC_SIZE or not self._security.check_reply(mac, bytes(view[1:1 + MAC_SIZE]),
                                                                         view[1 + MAC_SIZE:]):
            self._close_quietly()
            raise UnauthenticatedFrame(f"the reply of {self.address} to {self.method} is not signed with this "
                                       "application's secret")
        return bytes(view[1 + MAC_SIZE:])

    def _connected(self, timeout: float) -> socket.socket:
        if self._sock is None:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._tls is not None:
                    server_name = self._security.tls.server_name if self._security.tls is not None else None
                    sock = self._tls.wrap_socket(sock, server_hostname=server_name or self.host)
            except BaseException:
                sock.close()
                raise
            self._sock = sock
        return self._sock

    def _drop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def _close_quietly(self) -> None:
        with self._lock:
            self._drop()

    def close(self) -> None:
        """Close the connection; a call in flight on another thread fails at once."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._close_quietly()
