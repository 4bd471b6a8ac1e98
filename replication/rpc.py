"""gRPC plumbing without code generation: raw-bytes unary methods on a generic service.

The data plane sends pre-framed batches (:mod:`replication.framing`); the control
plane sends pickled dicts.  Both run on :func:`serve` servers and :class:`Peer`
clients.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

SERVICE = "replication.v1.Runtime"
_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]

BytesHandler = Callable[[bytes], bytes]


def serve(handlers: dict[str, BytesHandler], *, max_workers: int, bind_host: str = "0.0.0.0") -> tuple[grpc.Server, int]:
    """Start a server for ``handlers`` (method name -> bytes -> bytes) on a free port."""
    method_handlers = {
        name: grpc.unary_unary_rpc_method_handler(lambda req, ctx, fn=fn: fn(req))
        for name, fn in handlers.items()
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
                         options=_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, method_handlers),))
    port = server.add_insecure_port(f"{bind_host}:0")
    if not port:
        raise OSError(f"could not bind a gRPC port on {bind_host}")
    server.start()
    return server, port


def pickled(fn: Callable[[Any], Any]) -> BytesHandler:
    """Adapt an object -> object function to a bytes handler (control plane)."""
    return lambda req: pickle.dumps(fn(pickle.loads(req)), protocol=5)


class Peer:
    """A client to one remote runtime server."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = grpc.insecure_channel(address, options=_OPTIONS)
        self._methods: dict[str, Any] = {}

    def call_bytes(self, method: str, payload: bytes, timeout: float | None = None) -> bytes:
        stub = self._methods.get(method)
        if stub is None:
            stub = self._methods[method] = self._channel.unary_unary(f"/{SERVICE}/{method}")
        return stub(payload, timeout=timeout)

    def call(self, method: str, obj: Any, timeout: float | None = None) -> Any:
        return pickle.loads(self.call_bytes(method, pickle.dumps(obj, protocol=5), timeout))

    def close(self) -> None:
        self._channel.close()


def is_retryable(err: grpc.RpcError) -> bool:
    """Transport-level failures worth retrying (peer not up yet, connection reset)."""
    code = err.code() if hasattr(err, "code") else None
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
