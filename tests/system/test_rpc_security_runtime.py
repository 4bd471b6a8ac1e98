"""The RPC servers of a running job on real executors: closed to whoever is not part of the job.

A stranger who reaches the driver's or a worker's port sends a pickle whose unpickling would run
a shell command; nothing runs (no marker file), whether the call is unsigned, signed with another
secret, or even signed with the job's own secret (the control plane never unpickles), the refused
calls show in the metrics, and the job goes on exactly.  A job with TLS on runs green through an
executor kill and restores over TLS.
"""

from __future__ import annotations

import pickle
import re
import socket
import struct
import time
import urllib.request

import grpc
import pytest

from ops.chaos import kill_executor, locate
from replication.examples.ordered import verify_chains
from replication.security import read_cli_credentials
from replication.status import read_status
from tests.ordered_runs import fed_without_pause, read_output, replicas_sharing_worker, source_topics
from tests.transport.test_transport import Hostile, tls_files
from transport import rpc
from transport.security import RpcSecurity

pytestmark = pytest.mark.integration

DRIVER_METHODS = ("Register", "Finished", "MoveVnodes")
WORKER_METHODS = ("DataPort", "HandoverState", "HandoverCut", "Restore", "IncrementChunk", "IncrementAck")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(stack, **extra: str) -> dict[str, str]:
    return {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers,
            "spark.replication.enabled": "true", "spark.replication.mode": "liverobin",
            "spark.replication.rhino.enabled": "true", "spark.replication.rhino.checkpointEvery": "20", **extra}


def _call(address: str, method: str, payload: bytes) -> grpc.StatusCode:
    """A raw gRPC call that knows nothing of the project but the service name."""
    channel = grpc.insecure_channel(address)
    try:
        channel.unary_unary(f"/{rpc.SERVICE}/{method}")(payload, timeout=10)
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()
    finally:
        channel.close()


def _push(address: str, port: int, request: bytes) -> int | None:
    """A raw frame to a frame server (a worker's ``PushMany``, the driver's ``Heartbeat``): the status byte (0 answered,
    1 failed or refused), None if the connection closed without a reply."""
    host = address.rsplit(":", 1)[0].strip("[]")
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(struct.pack(">I", len(request)) + request)
        try:
            head = s.recv(5)
        except ConnectionResetError:
            return None
        return head[4] if len(head) == 5 else None


def _refused(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^replication_rpc_refused_calls_total\{job="[^"]*",process="([^"]*)"\} (\S+)$', text, re.M)}


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_hostile_pickle_sent_to_the_driver_or_a_worker_runs_nothing(stack, spark, topic_prefix, tmp_path):
    from replication import run
    from replication.examples.ordered import build_ordered_job

    marker = tmp_path / "pwned"
    hostile = pickle.dumps(Hostile(marker))
    name = f"{topic_prefix}hostile"
    a, b = source_topics(stack, name)
    job = build_ordered_job(a, b, f"{name}out", name=name)
    handle = run(job, spark=spark, conf=_conf(stack, **{"spark.replication.metrics.port": str(_free_port())}))
    handle.wait_started(120)
    try:
        with fed_without_pause(stack, a, b) as ids:
            status = read_status(job.name)
            driver = status["control_address"]
            workers = [w["address"] for w in status["workers"].values()]
            assert driver and len(workers) == 3
            job_secret = read_cli_credentials(job.name)
            stranger = RpcSecurity.generate()
            targets = [(driver, m) for m in DRIVER_METHODS] + [(w, m) for w in workers for m in WORKER_METHODS]
            for address, method in targets:
                assert _call(address, method, hostile) == grpc.StatusCode.UNAUTHENTICATED, (address, method)
                stamp, mac = stranger.sign(method, hostile)
                assert _call(address, method, stamp + mac + hostile) == grpc.StatusCode.UNAUTHENTICATED, \
                    (address, method)
            data_ports = {w: rpc.Peer(w, job_secret).call("DataPort", None, int, timeout=10) for w in workers}
            frame_ports = [(w, port, "PushMany") for w, port in data_ports.items()] + \
                [(driver, status["heartbeat_port"], "Heartbeat")]  # the driver's heartbeat frames
            for address, port, method in frame_ports:  # frames: unsigned, then another secret's
                assert _push(address, port, hostile) == 1, (address, method)
                assert _push(address, port, b"".join(stranger.sign(method, hostile)) + hostile) == 1, (address, method)
            # signed with the job's own secret (a compromised peer): still never unpickled
            for address, method in targets:
                stamp, mac = job_secret.sign(method, hostile)
                assert _call(address, method, stamp + mac + hostile) != grpc.StatusCode.UNAUTHENTICATED, \
                    (address, method)
            for address, port, method in frame_ports:
                assert _push(address, port, b"".join(job_secret.sign(method, hostile)) + hostile) in (0, 1)  # answered
            time.sleep(1.0)  # a command that ran would have created the marker by now
            assert not marker.exists()
            per_worker = 2 * len(WORKER_METHODS) + 2
            per_driver = 2 * len(DRIVER_METHODS) + 2
            _wait(lambda: _refused(handle.metrics_url).get("driver", 0) >= per_driver
                  and all(_refused(handle.metrics_url).get(f"worker {w}", 0) >= per_worker for w in range(3)),
                  10, "the refused calls in the metrics")
            assert _refused(handle.metrics_url)["driver"] == per_driver
    except BaseException:
        handle.stop()
        raise
    result = handle.drain(timeout=300)
    assert not marker.exists()
    report = verify_chains(read_output(stack, f"{job.name}out"), ids)
    assert report.exact and result.status == "finished", report


def test_a_job_with_tls_on_masks_an_executor_kill_and_restores_over_tls(stack, spark, topic_prefix, tmp_path):
    from replication import run
    from replication.examples.ordered import build_ordered_job

    files = tls_files(tmp_path)
    name = f"{topic_prefix}tls"
    a, b = source_topics(stack, name)
    job = build_ordered_job(a, b, f"{name}out", name=name)
    handle = run(job, spark=spark, conf=_conf(stack, **{
        "spark.replication.rpc.tls.enabled": "true", "spark.replication.rpc.tls.certChain": files["chain"],
        "spark.replication.rpc.tls.privateKey": files["key"], "spark.replication.rpc.tls.trustCerts": files["ca"]}))
    handle.wait_started(120)
    try:
        with fed_without_pause(stack, a, b) as ids:
            driver = read_status(job.name)["control_address"]
            assert _call(driver, "Heartbeat", b"") == grpc.StatusCode.UNAVAILABLE  # plaintext: no handshake
            _wait(lambda: all(cp is not None for cp in handle.master.rhino.completed.values())
                  and len(handle.master.rhino.completed) == len(handle.master.rhino.instances()), 60,
                  "a completed checkpoint of every partition")
            victim = "chain[0]r0"
            lost = replicas_sharing_worker(handle, victim)
            kill_executor(locate(victim, job=job.name))
            _wait(lambda: len(handle.recoveries()) >= 1, 90, "a replica restored over TLS")
            time.sleep(1.0)
    except BaseException:
        handle.stop()
        raise
    result = handle.drain(timeout=300)
    report = verify_chains(read_output(stack, f"{job.name}out"), ids)
    assert report.exact and result.status == "finished", report
    assert lost >= 1 and result.recoveries and not result.divergences
