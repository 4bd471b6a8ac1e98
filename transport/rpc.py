"""gRPC plumbing without code generation: signed raw-bytes unary methods on a generic service.

Every server (the driver's job master, each worker's data and control plane, Rhino's chain
replication) is started by :func:`serve` on one host, never on every interface unless told so,
and refuses any call not signed with the application's secret before it reads the payload
(:mod:`transport.security`); with TLS material it listens on TLS only, and every
:class:`Peer` dials with TLS.  The data plane sends pre-framed batches as bytes; the control
plane sends typed messages in :mod:`transport.wire`'s safe encoding (:func:`typed`,
:meth:`Peer.call`), never pickles.  A *watch* (:meth:`Peer.watch`) is a signed call the server
holds open for as long as the caller's process lives: its server learns within milliseconds that
the process exited (its connection closed), where a silence would take a timeout to tell; the
server can also ring the watch's :class:`Bell` to tell its caller, at once and signed, that
something changed (the caller then asks what through its ordinary calls).  A
*stream* (:meth:`Peer.stream`) is one long call carrying many one-way messages, each signed on
its own: frequent small reports without a call's set-up each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from transport import wire
from transport.security import MAC_SIZE, STAMP_SIZE, Refusals, RpcSecurity, TlsMaterial

__all__ = ["Bell", "BytesHandler", "OpenCall", "Peer", "RpcServer", "StreamHandler", "UnauthenticatedReply",
           "WatchHandler", "Watched", "decoding", "is_retryable", "serve", "typed"]

log = logging.getLogger(__name__)

SERVICE = "replication.v1.Runtime"
_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]

BytesHandler = Callable[[bytes], bytes]


class Bell:
    """A watch's server-side bell: each :meth:`ring` reaches the watching caller as one signed
    message carrying nothing but a count (a hint to ask again, never data).  Rings that come
    while one is on its way merge into it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rung = 0
        self._closed = False

    def ring(self) -> None:
        with self._cond:
            self._rung += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait_past(self, seen: int, timeout: float | None = None) -> int | None:
        """The ring count once it passed ``seen`` (still ``seen`` after ``timeout``); None once
        the bell is closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._rung != seen or self._closed, timeout)
            return None if self._closed else self._rung


@dataclass(frozen=True)
class Watched:
    """What a watch handler gives back: what to run once the call ends (the caller's process
    exited, it closed the watch, or the server stops), and the bell that reaches the caller."""

    on_end: Callable[[], None]
    bell: Bell | None = None


# a watch: the caller's payload -> what the server holds for it
WatchHandler = Callable[[bytes], Watched]
# a stream: called with each message's payload, in order
StreamHandler = Callable[[bytes], None]
Req = TypeVar("Req")
T = TypeVar("T")


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class RpcServer:
    """A started server: its port, the calls it refused, and :meth:`stop`."""

    def __init__(self, server: grpc.Server, port: int, refusals: Refusals) -> None:
        self._server = server
        self.port = port
        self.refusals = refusals

    @property
    def refused(self) -> int:
        return self.refusals.count

    def stop(self, grace: float | None = None) -> None:
        self._server.stop(grace)


_HEAD = STAMP_SIZE + MAC_SIZE  # a signed request: signing time, MAC, payload; a reply: MAC, payload


def _verified(method: str, request: bytes, context: Any, security: RpcSecurity,
              refusals: Refusals) -> tuple[bytes, bytes]:
    """The MAC and payload of a signed request; the call is aborted if the signature is not good."""
    view = memoryview(request)
    stamp, mac, payload = view[:STAMP_SIZE], view[STAMP_SIZE:_HEAD], view[_HEAD:]
    why = security.check(method, bytes(stamp), bytes(mac), payload) if len(request) >= _HEAD else "unsigned call"
    if why is not None:
        refusals.refuse(context.peer(), method, why)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, f"refused: {why}")
    return bytes(mac), bytes(payload)


def _signed(method: str, fn: BytesHandler, security: RpcSecurity, refusals: Refusals) -> Callable[[bytes, Any], bytes]:
    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        mac, payload = _verified(method, request, context, security, refusals)
        reply = fn(payload)
        return security.sign_reply(mac, reply) + reply
    return handle


def _watched(method: str, fn: WatchHandler, security: RpcSecurity,
             refusals: Refusals) -> Callable[[bytes, Any], Iterator[bytes]]:
    def handle(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        mac, payload = _verified(method, request, context, security, refusals)
        watched = fn(payload)
        bell = watched.bell
        ended = threading.Event()
        once = threading.Lock()

        def end() -> None:
            # run by gRPC when the call ends: a cancelled call's handler may never be resumed
            with once:
                if ended.is_set():
                    return
                ended.set()
            if bell is not None:
                bell.close()
            watched.on_end()

        if not context.add_callback(end):  # (False: the call has ended already)
            end()
        try:
            yield b""  # (holds one of the server's threads until the call ends)
            seen: int | None = 0
            while bell is not None and (seen := bell.wait_past(seen)) is not None:
                count = seen.to_bytes(8, "big")
                yield security.sign_reply(mac, count) + count
            ended.wait()
        finally:
            end()
    return handle


def _streamed(method: str, fn: StreamHandler, security: RpcSecurity,
              refusals: Refusals) -> Callable[[Iterator[bytes], Any], bytes]:
    def handle(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        for request in requests:
            _, payload = _verified(method, request, context, security, refusals)  # (aborts the stream)
            fn(payload)
        return b""
    return handle


def serve(handlers: dict[str, BytesHandler], *, security: RpcSecurity, bind_host: str, max_workers: int,
          name: str = "rpc server", watches: dict[str, WatchHandler] | None = None,
          streams: dict[str, StreamHandler] | None = None, refusals: Refusals | None = None) -> RpcServer:
    """Start a server for ``handlers`` (method name -> bytes -> bytes), ``watches`` and ``streams``
    on a free port of ``bind_host``; each open watch or stream holds one of the ``max_workers``
    threads.  ``refusals`` may be shared with the process's other servers (one count)."""
    refusals = refusals or Refusals(name)
    method_handlers = {method: grpc.unary_unary_rpc_method_handler(_signed(method, fn, security, refusals))
                       for method, fn in handlers.items()}
    method_handlers.update({method: grpc.unary_stream_rpc_method_handler(_watched(method, fn, security, refusals))
                            for method, fn in (watches or {}).items()})
    method_handlers.update({method: grpc.stream_unary_rpc_method_handler(_streamed(method, fn, security, refusals))
                            for method, fn in (streams or {}).items()})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
                         options=_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, method_handlers),))
    address = host_port(bind_host, 0)
    if security.tls is not None:
        tls = security.tls
        credentials = grpc.ssl_server_credentials([(tls.private_key, tls.cert_chain)], root_certificates=tls.trust,
                                                  require_client_auth=True)
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if not port:
        raise OSError(f"could not bind a gRPC port on {bind_host}")
    server.start()
    return RpcServer(server, port, refusals)


def typed(fn: Callable[[Req], Any], request_type: type[Req]) -> BytesHandler:
    """Adapt a message -> message function to a bytes handler (control plane): the request must
    decode to a ``request_type``, or the call fails without ``fn`` seeing it."""
    return lambda request: wire.encode(fn(wire.decode(request, request_type)))


def decoding(fn: Callable[[Req], T], request_type: type[Req]) -> Callable[[bytes], T]:
    """Adapt a message -> anything function to a watch or stream handler: the request must
    decode to a ``request_type``, or the call fails without ``fn`` seeing it."""
    return lambda request: fn(wire.decode(request, request_type))


class UnauthenticatedReply(grpc.RpcError):
    """A reply whose signature does not match the call: not from a server of this application."""

    def __init__(self, address: str, method: str) -> None:
        super().__init__(f"the reply of {address} to {method} is not signed with this application's secret")

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAUTHENTICATED

    def details(self) -> str:
        return str(self)


def _channel(address: str, tls: TlsMaterial | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address, options=_OPTIONS)
    options = list(_OPTIONS)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    credentials = grpc.ssl_channel_credentials(root_certificates=tls.trust, private_key=tls.private_key,
                                               certificate_chain=tls.cert_chain)
    return grpc.secure_channel(address, credentials, options=options)


class Peer:
    """A client to one remote runtime server."""

    def __init__(self, address: str, security: RpcSecurity) -> None:
        self.address = address
        self._security = security
        self._channel = _channel(address, security.tls)
        self._methods: dict[str, Any] = {}

    @property
    def security(self) -> RpcSecurity:
        return self._security

    def call_bytes(self, method: str, payload: bytes, timeout: float | None = None) -> bytes:
        stub = self._methods.get(method)
        if stub is None:
            stub = self._methods[method] = self._channel.unary_unary(f"/{SERVICE}/{method}")
        stamp, mac = self._security.sign(method, payload)
        reply = stub(stamp + mac + payload, timeout=timeout)
        view = memoryview(reply)
        if len(reply) < MAC_SIZE or not self._security.check_reply(mac, bytes(view[:MAC_SIZE]), view[MAC_SIZE:]):
            raise UnauthenticatedReply(self.address, method)
        return bytes(view[MAC_SIZE:])

    def call(self, method: str, message: Any, reply_type: type | tuple[type, ...] | None = None,
             timeout: float | None = None) -> Any:
        """Send a control message; the reply, decoded (and checked to be a ``reply_type``)."""
        return wire.decode(self.call_bytes(method, wire.encode(message), timeout), reply_type)

    def watch(self, method: str, message: Any, on_ring: Callable[[], None] | None = None) -> OpenCall:
        """Open a watch: the server holds the call open until :meth:`OpenCall.close`, this process
        exits or the server stops (the server's handler then runs its end callback).  With
        ``on_ring``, a thread of this call runs it for each ring of the server's :class:`Bell`."""
        signed = self._signed(method, message)
        call = self._channel.unary_stream(f"/{SERVICE}/{method}")(signed)
        if on_ring is not None:
            mac = signed[STAMP_SIZE:_HEAD]
            threading.Thread(target=self._hear_rings, args=(method, call, mac, on_ring), daemon=True,
                             name=f"watch-{method}").start()
        return OpenCall(self.address, method, call)

    def _hear_rings(self, method: str, call: Any, mac: bytes, on_ring: Callable[[], None]) -> None:
        try:
            for reply in call:
                if not reply:
                    continue  # the opening
                view = memoryview(reply)
                if not self._security.check_reply(mac, bytes(view[:MAC_SIZE]), view[MAC_SIZE:]):
                    log.warning("a ring of the watch %s of %s is not signed with this application's secret: "
                                "no longer heard", method, self.address)
                    return
                on_ring()
        except grpc.RpcError:
            return  # the watch ended (its end is reported by OpenCall)

    def stream(self, method: str, messages: Iterator[Any]) -> OpenCall:
        """Open a stream: every control message ``messages`` yields is signed and sent, in order,
        until it ends (the iterator is run by a gRPC thread: make it end before closing)."""
        signed = (self._signed(method, message) for message in messages)
        call = self._channel.stream_unary(f"/{SERVICE}/{method}").future(signed)
        return OpenCall(self.address, method, call)

    def _signed(self, method: str, message: Any) -> bytes:
        payload = wire.encode(message)
        stamp, mac = self._security.sign(method, payload)
        return stamp + mac + payload

    def close(self) -> None:
        self._channel.close()


class OpenCall:
    """An open watch or stream (:meth:`Peer.watch`, :meth:`Peer.stream`)."""

    def __init__(self, address: str, method: str, call: Any) -> None:
        self._closing = False
        self._call = call
        call.add_done_callback(lambda c: self._ended(address, method, c))

    def _ended(self, address: str, method: str, call: Any) -> None:
        if not self._closing:
            log.warning("the watch %s of %s ended: %s", method, address, call.code())

    @property
    def ended(self) -> bool:
        return self._call.done()

    def close(self) -> None:
        self._closing = True
        self._call.cancel()


def is_retryable(err: grpc.RpcError) -> bool:
    """Transport-level failures worth retrying (peer not up yet, connection reset, a server
    stopping under the call)."""
    code = err.code() if hasattr(err, "code") else None
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
