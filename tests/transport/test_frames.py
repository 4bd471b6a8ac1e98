"""The data plane's frame transport (transport.frames): signed requests and replies over one
socket per peer, refused before the handler runs when not signed, TLS only when configured."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from tests.transport.test_transport import tls_files
from transport.frames import (
    MAX_FRAME,
    FrameCallFailed,
    FramePeer,
    FrameServer,
    TransportFailure,
    UnauthenticatedFrame,
)
from transport.security import RpcSecurity, TlsMaterial

SECRET = RpcSecurity(b"frames-test-secret-0123456789abcdef")


@pytest.fixture
def echo():
    """A frame server answering ``Echo`` on 127.0.0.1 (what its handler received, in order)."""
    received: list[bytes] = []

    def handler(request: bytes) -> bytes:
        if request == b"fail":
            raise RuntimeError("asked to fail")
        received.append(request)
        return b"echo:" + request

    server = FrameServer("Echo", handler, security=SECRET, bind_host="127.0.0.1", max_connections=4, name="echo")
    yield server, received
    server.stop()


def _raw(port: int, frame: bytes) -> bytes:
    """Send ``frame`` on a fresh connection; what the server answers before it closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        out = b""
        try:
            s.sendall(frame)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass  # closed with the request unread (reset, or no longer connected)
        return out


def _request(stamp: bytes, mac: bytes, payload: bytes) -> bytes:
    body = stamp + mac + payload
    return struct.pack(">I", len(body)) + body


def test_a_signed_call_is_answered_with_a_signed_reply_on_one_connection(echo) -> None:
    server, received = echo
    peer = FramePeer("127.0.0.1", server.port, "Echo", SECRET)
    try:
        assert [peer.call(f"m{i}".encode(), timeout=5) for i in range(3)] == [b"echo:m0", b"echo:m1", b"echo:m2"]
        assert server.connections == 1
    finally:
        peer.close()
    assert received == [b"m0", b"m1", b"m2"] and server.refused == 0


def test_unsigned_wrongly_signed_stale_and_other_method_calls_are_refused_before_the_handler(echo, caplog) -> None:
    server, received = echo
    other = RpcSecurity.generate()
    caplog.set_level(logging.WARNING, logger="transport.security")
    frames = [struct.pack(">I", 1) + b"x", _request(*other.sign("Echo", b"x"), b"x"),
              _request(*SECRET.sign("Echo", b"x", now=time.time() - 3600), b"x"),
              _request(*SECRET.sign("Other", b"x"), b"x")]
    for frame in frames:
        reply = _raw(server.port, frame)
        assert reply[4] == 1 and b"refused" in reply, reply  # a failure, and the connection closed after it
    with pytest.raises(FrameCallFailed, match="refused: bad signature"):
        FramePeer("127.0.0.1", server.port, "Echo", other).call(b"x", timeout=5)
    assert received == [] and server.refused == 5
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1  # once per calling host


def test_a_frame_longer_than_the_limit_is_not_read(echo) -> None:
    server, received = echo
    assert _raw(server.port, struct.pack(">I", MAX_FRAME + 1) + b"x" * 100) == b""
    assert received == [] and server.refused == 1


def test_a_failing_handler_fails_that_call_and_the_next_goes_through(echo) -> None:
    server, _ = echo
    peer = FramePeer("127.0.0.1", server.port, "Echo", SECRET)
    try:
        with pytest.raises(FrameCallFailed, match="asked to fail"):
            peer.call(b"fail", timeout=5)
        assert peer.call(b"after", timeout=5) == b"echo:after"
    finally:
        peer.close()


def test_a_reply_not_signed_by_the_application_is_refused() -> None:
    """A stranger on a port a dead worker freed cannot feed a client a reply."""
    listener = socket.create_server(("127.0.0.1", 0))

    def forge() -> None:
        conn, _ = listener.accept()
        with conn:
            (length,) = struct.unpack(">I", conn.recv(4))
            while length > 0:
                length -= len(conn.recv(length))
            body = b"\x00" + b"m" * 32 + b"forged"
            conn.sendall(struct.pack(">I", len(body)) + body)

    threading.Thread(target=forge, daemon=True).start()
    peer = FramePeer("127.0.0.1", listener.getsockname()[1], "Echo", SECRET)
    try:
        with pytest.raises(UnauthenticatedFrame):
            peer.call(b"x", timeout=5)
    finally:
        peer.close()
        listener.close()


def test_a_server_listens_on_its_host_only(echo) -> None:
    server, _ = echo
    with socket.create_connection(("127.0.0.1", server.port), timeout=2):
        pass
    with pytest.raises(OSError), socket.create_connection(("127.0.0.2", server.port), timeout=2):
        pass


def test_a_call_to_a_stopped_server_is_a_transport_failure_and_a_new_server_is_reached_again() -> None:
    first = FrameServer("Echo", lambda r: r, security=SECRET, bind_host="127.0.0.1", max_connections=2)
    peer = FramePeer("127.0.0.1", first.port, "Echo", SECRET)
    try:
        assert peer.call(b"a", timeout=5) == b"a"
        first.stop()
        with pytest.raises(TransportFailure):
            peer.call(b"b", timeout=5)
        with pytest.raises(TransportFailure):  # nobody listens any more
            peer.call(b"c", timeout=5)
    finally:
        peer.close()


def test_connections_beyond_the_limit_are_closed_at_once() -> None:
    server = FrameServer("Echo", lambda r: r, security=SECRET, bind_host="127.0.0.1", max_connections=1)
    peers = [FramePeer("127.0.0.1", server.port, "Echo", SECRET) for _ in range(2)]
    try:
        assert peers[0].call(b"a", timeout=5) == b"a"
        with pytest.raises(TransportFailure):
            peers[1].call(b"b", timeout=5)
    finally:
        for peer in peers:
            peer.close()
        server.stop()


def test_a_peer_closed_while_a_call_waits_ends_that_call_at_once() -> None:
    release = threading.Event()
    server = FrameServer("Echo", lambda r: release.wait(10) and r, security=SECRET, bind_host="127.0.0.1",
                         max_connections=2)
    peer = FramePeer("127.0.0.1", server.port, "Echo", SECRET)
    failed: list[BaseException] = []

    def call() -> None:
        try:
            peer.call(b"x", timeout=30)
        except TransportFailure as exc:
            failed.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.2)
    started = time.monotonic()
    peer.close()
    caller.join(5)
    release.set()
    server.stop()
    assert failed and time.monotonic() - started < 5


def test_with_tls_calls_go_over_tls_only(tmp_path: Path) -> None:
    files = tls_files(tmp_path)
    security = RpcSecurity(SECRET.secret, TlsMaterial.from_files(files["chain"], files["key"], files["ca"]))
    server = FrameServer("Echo", lambda r: r, security=security, bind_host="127.0.0.1", max_connections=4)
    try:
        peer = FramePeer("127.0.0.1", server.port, "Echo", security)
        try:
            assert peer.call(b"over tls", timeout=10) == b"over tls"
        finally:
            peer.close()
        with pytest.raises(TransportFailure):  # same secret, no TLS: the handshake fails
            FramePeer("127.0.0.1", server.port, "Echo", SECRET).call(b"x", timeout=5)
        stranger_files = tls_files(tmp_path, "stranger")  # a certificate from another authority
        stranger = RpcSecurity(SECRET.secret, TlsMaterial.from_files(stranger_files["chain"], stranger_files["key"],
                                                                     files["ca"]))
        with pytest.raises(TransportFailure):
            FramePeer("127.0.0.1", server.port, "Echo", stranger).call(b"x", timeout=5)
    finally:
        server.stop()


def test_a_connection_that_sends_nothing_signed_does_not_keep_its_slot(monkeypatch) -> None:
    monkeypatch.setattr("transport.frames._FIRST_FRAME_TIMEOUT_S", 0.3)
    server = FrameServer("Echo", lambda r: r, security=SECRET, bind_host="127.0.0.1", max_connections=1)
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    peer = FramePeer("127.0.0.1", server.port, "Echo", SECRET)
    try:
        deadline = time.monotonic() + 10
        while server.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.connections == 1  # the silent one, accepted
        while server.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.connections == 0  # then let go
        assert peer.call(b"a", timeout=5) == b"a"
        time.sleep(0.6)  # a signed peer's link stays open however long it idles
        assert peer.call(b"b", timeout=5) == b"b" and server.connections == 1
    finally:
        idle.close()
        peer.close()
        server.stop()
