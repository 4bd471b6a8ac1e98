"""The transport layer without Spark: the safe encoding, signed calls, TLS and where servers listen."""

from __future__ import annotations

import enum
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from transport import rpc, wire
from transport.security import RpcSecurity, TlsMaterial

SECRET = RpcSecurity.generate()


# -- the safe encoding ----------------------------------------------------------------------------

@wire.record
class Color(enum.Enum):
    RED = "red"


@wire.record
@dataclass(frozen=True)
class Sample:
    n: int
    parts: tuple = ()
    counts: Counter = field(default_factory=Counter)
    color: Color = Color.RED


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary()
hashables = st.recursive(scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
                         max_leaves=8)
values = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.sets(hashables, max_size=3)
                   | st.dictionaries(hashables, inner, max_size=4)
                   | st.builds(Sample, st.integers(), st.tuples(inner))),
    max_leaves=20)


@given(values)
def test_plain_data_and_registered_records_round_trip_exactly(value) -> None:
    decoded = wire.decode(wire.encode(value))
    assert decoded == value and type(decoded) is type(value)


def test_only_registered_types_encode_and_decode() -> None:
    @dataclass
    class Unregistered:
        x: int

    with pytest.raises(wire.WireError, match="register"):
        wire.encode({"a": Unregistered(1)})
    with pytest.raises(wire.WireError, match="expected a Sample"):
        wire.decode(wire.encode({"a": 1}), Sample)


class Hostile:
    """What an attacker sends: unpickling it runs a shell command that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_does_not_decode_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for payload in (pickle.dumps(Hostile(marker)), pickle.dumps({"worker": Hostile(marker)}, protocol=2)):
        with pytest.raises(wire.WireError):
            wire.decode(payload)
    assert not marker.exists()


def test_a_record_naming_an_unregistered_class_is_refused() -> None:
    import msgpack

    forged = msgpack.packb(msgpack.ExtType(4, msgpack.packb(["os.system", "touch /tmp/x"])))
    with pytest.raises(wire.WireError, match="not a message type"):
        wire.decode(forged)


def test_rows_of_scalars_pack_in_one_pass() -> None:
    rows = [(1, b"key", b"value"), (2, b"k", None)]
    assert wire.unpack_rows(wire.pack_rows(rows)) == rows
    with pytest.raises(wire.WireError):
        wire.pack_rows([(object(),)])


# -- signed calls ------------------------------------------------------------------------------

@pytest.fixture
def echo():
    """A server with one ``Echo`` method on 127.0.0.1 (what it received, in order)."""
    received: list[bytes] = []

    def handler(request: bytes) -> bytes:
        received.append(request)
        return b"echo:" + request

    server = rpc.serve({"Echo": handler}, security=SECRET, bind_host="127.0.0.1", max_workers=4, name="echo")
    yield server, f"127.0.0.1:{server.port}", received
    server.stop(0)


def _raw_call(address: str, payload: bytes) -> grpc.RpcError | bytes:
    channel = grpc.insecure_channel(address)
    try:
        return channel.unary_unary(f"/{rpc.SERVICE}/Echo")(payload, timeout=5)
    except grpc.RpcError as err:
        return err
    finally:
        channel.close()


def test_a_signed_call_is_answered_with_a_signed_reply(echo) -> None:
    server, address, received = echo
    peer = rpc.Peer(address, SECRET)
    try:
        assert peer.call_bytes("Echo", b"hello", timeout=5) == b"echo:hello"
    finally:
        peer.close()
    assert received == [b"hello"] and server.refused == 0


def test_unsigned_wrongly_signed_and_stale_calls_are_refused_before_the_handler_runs(echo, caplog) -> None:
    server, address, received = echo
    other = RpcSecurity.generate()
    stamp, mac = other.sign("Echo", b"x")
    old_stamp, old_mac = SECRET.sign("Echo", b"x", now=time.time() - 3600)
    caplog.set_level(logging.WARNING, logger="transport.security")
    for request in (b"x", b"x" * 100, stamp + mac + b"x", old_stamp + old_mac + b"x"):
        err = _raw_call(address, request)
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAUTHENTICATED, err
    peer = rpc.Peer(address, other)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            peer.call_bytes("Echo", b"x", timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        peer.close()
    assert received == [] and server.refused == 5
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1  # once per calling host


def test_a_signature_covers_the_method_and_the_payload() -> None:
    stamp, mac = SECRET.sign("Echo", b"payload")
    assert SECRET.check("Echo", stamp, mac, b"payload") is None
    assert SECRET.check("Echo", stamp, mac, b"payloaD") == "bad signature"
    assert SECRET.check("Other", stamp, mac, b"payload") == "bad signature"


def test_a_reply_not_signed_by_the_application_is_refused() -> None:
    """A server that does not hold the secret (say, a stranger on a port a dead worker freed)
    cannot feed a client a reply."""
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(2))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: b"forged")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(rpc.SERVICE, {"Echo": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    peer = rpc.Peer(f"127.0.0.1:{port}", SECRET)
    try:
        with pytest.raises(rpc.UnauthenticatedReply):
            peer.call_bytes("Echo", b"x", timeout=5)
    finally:
        peer.close()
        server.stop(0)


def test_a_server_listens_on_its_host_only(echo) -> None:
    """Bound to 127.0.0.1: another address of this machine (127.0.0.2, also loopback) is refused."""
    server, _, _ = echo
    with socket.create_connection(("127.0.0.1", server.port), timeout=2):
        pass
    with pytest.raises(OSError), socket.create_connection(("127.0.0.2", server.port), timeout=2):
        pass


# -- watches ---------------------------------------------------------------------------------

_WATCHER = """
import sys, time
from transport import rpc
from transport.security import RpcSecurity
peer = rpc.Peer(sys.argv[1], RpcSecurity(bytes.fromhex(sys.argv[2])))
watch = peer.watch("Watch", sys.argv[3])
print("watching", flush=True)
time.sleep(120)
"""


@pytest.fixture
def watched():
    """A server with one ``Watch`` method: which watches opened, and an event per watch that ended."""
    opened: list[str] = []
    ended: dict[str, threading.Event] = {}

    def on_watch(name: str) -> rpc.Watched:
        opened.append(name)
        return rpc.Watched(ended.setdefault(name, threading.Event()).set)

    server = rpc.serve({}, watches={"Watch": rpc.decoding(on_watch, str)}, security=SECRET,
                       bind_host="127.0.0.1", max_workers=4, name="watched")
    yield server, opened, ended
    server.stop(0)


def _wait_for(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_watch_ends_on_the_server_when_the_watching_process_is_killed(watched) -> None:
    """What the driver counts on to notice a killed worker process without waiting out a silence."""
    server, opened, ended = watched
    address = f"127.0.0.1:{server.port}"
    proc = subprocess.Popen([sys.executable, "-c", _WATCHER, address, SECRET.secret.hex(), "w1"],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout.readline().strip() == "watching"
        assert _wait_for(lambda: opened == ["w1"])
        assert not ended["w1"].wait(0.3)  # held open while the process lives
        proc.send_signal(signal.SIGKILL)
        assert ended["w1"].wait(30)
    finally:
        proc.kill()
        proc.wait()


def test_a_watch_ends_when_closed_and_an_unsigned_one_never_opens(watched) -> None:
    server, opened, ended = watched
    address = f"127.0.0.1:{server.port}"
    peer = rpc.Peer(address, SECRET)
    stranger = rpc.Peer(address, RpcSecurity.generate())
    try:
        watch = peer.watch("Watch", "w2")
        assert _wait_for(lambda: opened == ["w2"])
        watch.close()
        assert ended["w2"].wait(30)
        stranger.watch("Watch", "w3")
        assert _wait_for(lambda: server.refused == 1)
        assert opened == ["w2"]
    finally:
        peer.close()
        stranger.close()



class _CancelledCall:
    """A server context whose call the caller cancels right after the handler's first reply."""

    def __init__(self) -> None:
        self.callbacks: list = []

    def add_callback(self, callback) -> bool:
        self.callbacks.append(callback)
        return True

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def cancel(self) -> None:
        for callback in self.callbacks:
            callback()


def test_a_watch_closed_by_its_caller_ends_on_the_server_even_if_its_handler_is_never_resumed() -> None:
    """gRPC need not resume a cancelled call's handler past its first reply: the end callback runs
    from the call's termination itself (the watch test failed one run that way: 'assert False')."""
    from transport.security import Refusals

    ended = threading.Event()
    handler = rpc._watched("Watch", rpc.decoding(lambda name: rpc.Watched(ended.set), str), SECRET, Refusals("t"))
    peer = rpc.Peer("127.0.0.1:1", SECRET)
    try:
        context = _CancelledCall()
        replies = handler(peer._signed("Watch", "w9"), context)
        assert next(replies) == b""
        context.cancel()  # ... and the server drops the handler without resuming it
        assert ended.is_set()
        replies.close()
        context.cancel()
    finally:
        peer.close()


# -- streams ---------------------------------------------------------------------------------

def test_a_stream_delivers_signed_messages_in_order_and_a_forged_one_ends_it() -> None:
    received: list[int] = []
    server = rpc.serve({}, streams={"Report": rpc.decoding(received.append, int)}, security=SECRET,
                       bind_host="127.0.0.1", max_workers=4, name="reports")
    address = f"127.0.0.1:{server.port}"
    peer = rpc.Peer(address, SECRET)
    stranger = rpc.Peer(address, RpcSecurity.generate())
    try:
        gate = threading.Event()

        def messages():
            yield from range(50)
            gate.wait(30)  # (the stream stays open while its iterator waits)
            yield 50

        stream = peer.stream("Report", messages())
        assert _wait_for(lambda: len(received) == 50)
        assert not stream.ended
        gate.set()
        assert _wait_for(lambda: stream.ended)
        assert received == list(range(51))
        forged = stranger.stream("Report", iter([99]))
        assert _wait_for(lambda: forged.ended and server.refused == 1)
        assert 99 not in received
    finally:
        peer.close()
        stranger.close()
        server.stop(0)


# -- TLS ---------------------------------------------------------------------------------------

def tls_files(tmp_path: Path, name: str = "job") -> dict[str, str]:
    """A throwaway CA and a certificate for 127.0.0.1 and localhost, as PEM files."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"chain": tmp_path / f"{name}-chain.pem", "key": tmp_path / f"{name}-key.pem",
             "ca": tmp_path / f"{name}-ca.pem"}
    cert.private_key_pem.write_to_path(str(paths["key"]))
    paths["chain"].write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    ca.cert_pem.write_to_path(str(paths["ca"]))
    return {k: str(v) for k, v in paths.items()}


def test_with_tls_calls_go_over_tls_only(tmp_path: Path) -> None:
    files = tls_files(tmp_path)
    security = RpcSecurity(SECRET.secret, TlsMaterial.from_files(files["chain"], files["key"], files["ca"]))
    server = rpc.serve({"Echo": lambda r: r}, security=security, bind_host="127.0.0.1", max_workers=2)
    try:
        peer = rpc.Peer(f"127.0.0.1:{server.port}", security)
        try:
            assert peer.call_bytes("Echo", b"over tls", timeout=10) == b"over tls"
        finally:
            peer.close()
        plain = rpc.Peer(f"127.0.0.1:{server.port}", SECRET)  # same secret, no TLS: no handshake
        try:
            with pytest.raises(grpc.RpcError) as err:
                plain.call_bytes("Echo", b"x", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            plain.close()
        stranger_files = tls_files(tmp_path, "stranger")  # a certificate from another authority
        stranger = rpc.Peer(f"127.0.0.1:{server.port}", RpcSecurity(SECRET.secret, TlsMaterial.from_files(
            stranger_files["chain"], stranger_files["key"], files["ca"])))
        try:
            with pytest.raises(grpc.RpcError) as err:
                stranger.call_bytes("Echo", b"x", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            stranger.close()
    finally:
        server.stop(0)


def test_each_ring_of_a_watch_s_bell_reaches_its_caller_and_a_closed_watch_ends_the_bell() -> None:
    """How the driver tells a worker at once that something changed (a writer role, a dead
    worker), instead of at its next heartbeat."""
    bells: list[rpc.Bell] = []
    ended = threading.Event()

    def on_watch(name: str) -> rpc.Watched:
        bells.append(rpc.Bell())
        return rpc.Watched(ended.set, bells[-1])

    server = rpc.serve({}, watches={"Watch": rpc.decoding(on_watch, str)}, security=SECRET,
                       bind_host="127.0.0.1", max_workers=4, name="bells")
    peer = rpc.Peer(f"127.0.0.1:{server.port}", SECRET)
    heard = threading.Semaphore(0)
    try:
        call = peer.watch("Watch", "w1", on_ring=heard.release)
        assert _wait_for(lambda: len(bells) == 1)
        for _ in range(3):
            bells[0].ring()
            assert heard.acquire(timeout=30)
        assert not heard.acquire(timeout=0.2)  # nothing rang, nothing heard
        call.close()
        assert ended.wait(30)
        assert bells[0].wait_past(3) is None  # closed with the call
    finally:
        peer.close()
        server.stop(0)
