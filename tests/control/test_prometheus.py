"""The driver's Prometheus endpoint: the text format (parsed back by a strict parser of format
0.0.4), histogram buckets, the state collected from a job master, the HTTP server, and one real
replicated job scraped while it runs (and shown by ``replication status``)."""

from __future__ import annotations

import http.client
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liverobin.segments import HeartbeatLog
from replication.config import ReplicationConfig
from replication.control.liveness import WorkerInfo
from replication.control.master import JobMaster
from replication.control.prometheus import (
    CONTENT_TYPE,
    LATENCY_BUCKETS,
    DriverState,
    MetricsServer,
    PartitionState,
    ReplicaState,
    collect,
    escape_label_value,
    histogram_buckets,
    render,
)
from replication.examples.ordered import build_ordered_job
from replication.metrics import InstanceMetrics, LatencyHistogram
from replication.plan import place, plan_job

# -- a strict parser of the text exposition format 0.0.4 ------------------------------------------
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
_ANY_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(rf"(?P<name>{_NAME})(?:\{{(?P<labels>{_ANY_LABEL}(?:,{_ANY_LABEL})*,?)?\}})? (?P<value>\S+)"
                     r"(?: -?\d+)?")
_VALUE = re.compile(r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf)|NaN")
_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "\\": "\\", '"': '"'}[m[1]], value)


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: str = ""
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def get(self, suffix: str = "", **labels: str) -> float:
        """The value of the one sample with this suffix whose labels include ``labels``."""
        found = [v for n, ls, v in self.samples if n == self.name + suffix and labels.items() <= ls.items()]
        assert len(found) == 1, (self.name + suffix, labels, found)
        return found[0]


def parse(text: str) -> dict[str, Family]:
    """Parse an exposition, asserting the grammar: HELP/TYPE at most once per family and before its
    samples, a family's samples contiguous, valid names/labels/values, no duplicate series,
    histograms with cumulative ``_bucket``s ending at ``le="+Inf"`` equal to ``_count``."""
    assert text.endswith("\n")
    families: dict[str, Family] = {}
    closed: set[str] = set()
    current: str | None = None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def switch(name: str) -> Family:
        nonlocal current
        if current != name:
            assert name not in closed, f"samples of {name} are not contiguous"
            if current is not None:
                closed.add(current)
            current = name
        return families.setdefault(name, Family(name))

    for line in text[:-1].split("\n"):  # lines end at \n only (a label value may hold \r and the like)
        assert line.strip(" \t") == line and line, f"bad line {line!r}"
        if line.startswith("#"):
            m = re.fullmatch(rf"# (HELP|TYPE) ({_NAME}) ?(.*)", line)
            if m is None:
                continue  # a plain comment
            fam = switch(m[2])
            if m[1] == "TYPE":
                assert m[3] in _TYPES and not fam.samples and fam.type == "untyped", line
                fam.type = m[3]
            else:
                assert not fam.help and not fam.samples and re.fullmatch(r"(?:[^\\\n]|\\[\\n])*", m[3]), line
                fam.help = _unescape(m[3])
            continue
        m = _SAMPLE.fullmatch(line)
        assert m is not None, f"bad sample line {line!r}"
        name, value = m["name"], m["value"]
        assert _VALUE.fullmatch(value), f"bad value in {line!r}"
        labels = {k: _unescape(v) for k, v in re.findall(_LABEL, m["labels"] or "")}
        assert len(labels) == len(re.findall(_LABEL, m["labels"] or "")), f"duplicate label in {line!r}"
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and families.get(name[: -len(suffix)], Family("")).type == "histogram":
                base = name[: -len(suffix)]
        fam = switch(base)
        assert (base == name) == (fam.type != "histogram"), f"{line!r}: not a sample of a {fam.type}"
        assert ("le" in labels) == name.endswith("_bucket") or fam.type != "histogram", line
        key = (name, tuple(sorted(labels.items())))
        assert key not in seen, f"duplicate series {line!r}"
        seen.add(key)
        fam.samples.append((name, labels, float(value.replace("Inf", "inf"))))
    for fam in families.values():
        if fam.type == "counter":
            assert fam.name.endswith("_total") and all(v >= 0 for _, _, v in fam.samples), fam.name
        if fam.type == "histogram":
            _check_histogram(fam)
    return families


def _check_histogram(fam: Family) -> None:
    series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for name, labels, value in fam.samples:
        if name.endswith("_bucket"):
            rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            series.setdefault(rest, []).append((float(labels["le"].replace("Inf", "inf")), value))
    assert series, fam.name
    for rest, buckets in series.items():
        les = [le for le, _ in buckets]
        assert les == sorted(les) and les[-1] == math.inf, (fam.name, rest, les)
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), f"{fam.name}{rest}: buckets not cumulative: {counts}"
        assert counts[-1] == fam.get("_count", **dict(rest)), (fam.name, rest)
        assert fam.get("_sum", **dict(rest)) >= 0


# -- rendering ------------------------------------------------------------------------------------
def _hist(*seconds: float) -> LatencyHistogram:
    h = LatencyHistogram()
    for s in seconds:
        h.record(s)
    return h


def _state() -> DriverState:
    sink0 = InstanceMetrics(records_in=120, records_out=118, dead_lettered=2, role="writer",
                            latency=_hist(0.0004, 0.003, 0.003, 0.02, 0.7, 45.0))
    chain = InstanceMetrics(records_in=300, records_out=290, dedup_dropped=299, queue_batches=3, pulse=42,
                            leader=True, order_epoch=7, late_records=1, gaps=0)
    return DriverState(
        job='odd "job"\\name\nline', now=1_000.0,
        replicas=[ReplicaState("chain", 0, 0, True, chain), ReplicaState("chain", 0, 1, False, InstanceMetrics()),
                  ReplicaState("sink", 0, 0, True, sink0), ReplicaState("sink", 0, 1, True, None)],
        partitions=[PartitionState("chain", 0, 2, 1, (2,), 17, 997.5), PartitionState("sink", 0, 2, 2, (1, 2))],
        events=5, divergences=1, recoveries=2, checkpoints_compared=30, workers_alive=2, workers_dead=1)


def test_render_is_valid_and_carries_every_value() -> None:
    text = render(_state())
    fams = parse(text)
    job = 'odd "job"\\name\nline'
    chain0 = {"job": job, "task": "chain", "partition": "0", "replica": "0"}
    assert fams["replication_records_in_total"].type == "counter"
    assert fams["replication_records_in_total"].get(**chain0) == 300
    assert fams["replication_records_out_total"].get(**{**chain0, "task": "sink"}) == 118
    assert fams["replication_dead_lettered_total"].get(task="sink", replica="0") == 2
    assert fams["replication_dedup_dropped_total"].get(**chain0) == 299
    assert fams["replication_late_records_total"].get(**chain0) == 1
    assert fams["replication_sequence_gaps_total"].get(**chain0) == 0
    assert fams["replication_queue_batches"].type == "gauge" and fams["replication_queue_batches"].get(**chain0) == 3
    assert fams["replication_leader"].get(**chain0) == 1 and fams["replication_leader"].get(task="sink", replica="0") == 0
    assert fams["replication_order_epoch"].get(**chain0) == 7
    assert fams["replication_pulse"].get(**chain0) == 42
    assert fams["replication_finished"].get(**chain0) == 0
    live = fams["replication_replica_live"]
    assert (live.get(task="chain", replica="0"), live.get(task="chain", replica="1")) == (1, 0)
    assert live.get(task="sink", replica="1") == 1  # not reported yet, but placed and alive
    assert not [s for s in fams["replication_records_in_total"].samples if s[1]["task"] == "sink"
                and s[1]["replica"] == "1"]  # no counters before the first report
    part = {"job": job, "task": "chain", "partition": "0"}
    assert fams["replication_partition_replicas"].get(**part) == 2
    assert fams["replication_partition_live_replicas"].get(**part) == 1
    assert fams["replication_replica_group_size"].get(task="sink") == 2
    assert fams["replication_checkpoint_last_completed_id"].get(**part) == 17
    assert fams["replication_checkpoint_age_seconds"].get(**part) == 2.5
    assert len(fams["replication_checkpoint_last_completed_id"].samples) == 1  # sink[0]: none completed yet
    for name, value in (("events", 5), ("divergences", 1), ("recoveries", 2), ("checkpoints_compared", 30)):
        assert fams[f"replication_{name}_total"].get(job=job) == value
    assert fams["replication_workers_alive"].get() == 2 and fams["replication_workers_dead"].get() == 1
    assert all(name.startswith("replication_") and fam.help for name, fam in fams.items())
    # the label value is escaped on the wire, and unescaped by the parser to the original
    assert 'job="odd \\"job\\"\\\\name\\nline"' in text


def test_latency_histogram_buckets() -> None:
    fams = parse(render(_state()))
    lat = fams["replication_latency_seconds"]
    assert lat.type == "histogram"
    sink = {"task": "sink", "replica": "0"}
    assert lat.get("_count", **sink) == 6
    assert lat.get("_sum", **sink) == pytest.approx(0.0004 + 0.003 * 2 + 0.02 + 0.7 + 45.0)
    assert lat.get("_bucket", le="0.00048828125", **sink) == 1  # 2**-11 s
    assert lat.get("_bucket", le="0.00390625", **sink) == 3  # 2**-8 s
    assert lat.get("_bucket", le="0.03125", **sink) == 4
    assert lat.get("_bucket", le="1.0", **sink) == 5
    assert lat.get("_bucket", le="32.0", **sink) == 5  # 45 s is beyond the last finite bound
    assert lat.get("_bucket", le="+Inf", **sink) == 6
    assert not [sample for sample in lat.samples if sample[1]["task"] == "chain"]  # no empty histograms


@given(st.lists(st.floats(min_value=0.0, max_value=100.0), max_size=60))
def test_histogram_buckets_are_exact(values: list[float]) -> None:
    h = _hist(*values)
    buckets = histogram_buckets(h)
    assert [le for le, _ in buckets] == [*LATENCY_BUCKETS, math.inf]
    for le, count in buckets[:-1]:  # exact: values below the bound (one equal to it counts in the next)
        assert count == sum(1 for v in values if max(v, 1e-6) < le)
    assert buckets[-1][1] == len(values)


@given(st.text(max_size=30))
def test_label_values_round_trip(value: str) -> None:
    assert "\n" not in escape_label_value(value)
    fams = parse(render(DriverState(job=value, now=0.0)))
    assert fams["replication_events_total"].get(job=value) == 0


# -- collected from a real job master (no Spark) ---------------------------------------------------
def _master(rhino: bool = True) -> JobMaster:
    job = build_ordered_job("a", "b", "out", name="prom")
    plan = plan_job(job, default_parallelism=2, num_key_groups=64, num_vnodes=8,
                    topic_partitions={"a": 2, "b": 2})
    plan.replicas, plan.heartbeat_log = 2, HeartbeatLog("_replication.prom.heartbeats.r1")  # as prepare() sets them
    conf = {"spark.replication.kafka.bootstrapServers": "127.0.0.1:1", "spark.replication.enabled": "true",
            "spark.replication.mode": "liverobin", "spark.replication.rhino.enabled": str(rhino).lower()}
    return JobMaster(plan, place(plan, 3), 3, ReplicationConfig.from_mapping(conf), "prom", "app-1")


def test_collect_from_a_job_master() -> None:
    master = _master()
    for w in range(3):
        master.workers[w] = WorkerInfo(w, 0, str(w + 1), f"127.0.0.1:{5000 + w}")
    chain = next(t.id for t in master.plan.tasks if t.name == "chain")
    victim = master.placement[(chain, 0, 0)]
    master.dead[victim] = "executor left"
    master.lost[(chain, 0, 0)] = 123.0
    master.metrics["chain[0]r1"] = InstanceMetrics(records_in=10, pulse=4)
    master.rhino.checkpoint_completed((chain, 1), 9, {}, now=500.0, holders=[0])
    master.events.append((1.0, "x"))
    state = collect(master, now=510.0)
    assert state.job == "prom" and state.events == 1 and (state.workers_alive, state.workers_dead) == (2, 1)
    by_part = {(p.task, p.partition): p for p in state.partitions}
    assert len(by_part) == sum(t.parallelism for t in master.plan.tasks)
    assert all(p.replicas == 2 for p in state.partitions)
    assert by_part[("chain", 0)].live_replicas == 1
    lost_everywhere = {(t, p) for (t, p, _), w in master.placement.items() if w == victim}
    for (t, p), part in by_part.items():
        tid = next(task.id for task in master.plan.tasks if task.name == t)
        assert part.live_replicas == (1 if (tid, p) in lost_everywhere else 2), (t, p)
        assert part.group is not None
    assert (by_part[("chain", 1)].checkpoint_id, by_part[("chain", 1)].checkpoint_completed_at) == (9, 500.0)
    reps = {(r.task, r.partition, r.replica): r for r in state.replicas}
    assert reps[("chain", 0, 1)].metrics.pulse == 4 and reps[("chain", 0, 0)].live is False
    fams = parse(render(state))
    assert fams["replication_checkpoint_age_seconds"].get(task="chain", partition="1") == 10.0
    assert fams["replication_partition_live_replicas"].get(task="chain", partition="0") == 1
    no_rhino = parse(render(collect(_master(rhino=False))))
    assert "replication_replica_group_size" not in no_rhino
    assert "replication_checkpoint_last_completed_id" not in no_rhino


# -- the HTTP endpoint ----------------------------------------------------------------------------
def _get(url: str, method: str = "GET") -> tuple[int, str, str]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def test_metrics_server_serves_and_closes() -> None:
    calls = []

    def source() -> str:
        calls.append(1)
        return render(_state())

    server = MetricsServer(source, 0, host="127.0.0.1")
    try:
        assert server.port > 0 and server.url() == f"http://127.0.0.1:{server.port}/metrics"
        code, ctype, body = _get(server.url())
        assert (code, ctype) == (200, CONTENT_TYPE) and ctype.startswith("text/plain; version=0.0.4")
        assert parse(body)["replication_events_total"].get() == 5 and len(calls) == 1
        assert _get(server.url() + "?x=1")[0] == 200
        base = f"http://127.0.0.1:{server.port}"
        for path in ("/", "/metric", "/metrics/x", "/favicon.ico"):
            assert _get(base + path)[0] == 404, path
        assert _get(server.url(), method="POST")[0] == 405
        assert _get(base + "/other", method="POST")[0] == 404
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("HEAD", "/metrics")
        head = conn.getresponse()
        assert head.status == 200 and int(head.headers["Content-Length"]) == len(body.encode())
        assert head.read() == b""
        conn.close()
    finally:
        server.close()
    server.close()  # idempotent
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()


def test_metrics_server_survives_a_failing_render() -> None:
    state = {"fail": True}

    def source() -> str:
        if state["fail"]:
            raise RuntimeError("boom")
        return render(DriverState(job="j", now=0.0))

    server = MetricsServer(source, 0, host="127.0.0.1")
    try:
        code, _, body = _get(server.url())
        assert code == 500 and "boom" in body
        state["fail"] = False
        assert _get(server.url())[0] == 200
    finally:
        server.close()


def test_metrics_server_refuses_a_busy_port() -> None:
    server = MetricsServer(lambda: "", 0, host="127.0.0.1")
    try:
        with pytest.raises(OSError):
            MetricsServer(lambda: "", server.port, host="127.0.0.1")
    finally:
        server.close()


# -- a real replicated job, scraped while it runs ---------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class _Conf:
    def get(self, key: str, default: str | None = None) -> str | None:
        return "127.0.0.1" if key == "spark.driver.host" else default


class _FakeSparkContext:
    def getConf(self) -> _Conf:  # noqa: N802 - pyspark's name
        return _Conf()


def _handle(port: int):
    """A JobHandle around a job master without Spark (nothing runs; only the endpoint is real)."""
    from replication import JobHandle

    master = _master()
    master.plan.heartbeat_log = None  # no pulse generator
    cfg = ReplicationConfig.from_mapping({"spark.replication.kafka.bootstrapServers": "127.0.0.1:1",
                                          "spark.replication.metrics.port": str(port)})
    job = build_ordered_job("a", "b", "out", name="prom")
    return JobHandle(job, cfg, master.plan, master.placement, master, None, _FakeSparkContext(), "g")


def test_job_handle_serves_the_endpoint_on_the_configured_port() -> None:
    port = _free_port()
    handle = _handle(port)
    try:
        assert handle.metrics_url == f"http://127.0.0.1:{port}/metrics"
        assert handle.master.metrics_url == handle.metrics_url  # published in the status file
        code, _, body = _get(handle.metrics_url)
        assert code == 200 and parse(body)["replication_partition_replicas"].get(task="chain", partition="1") == 2
    finally:
        handle.metrics_server.close()
    busy = MetricsServer(lambda: "", 0)
    try:  # a port in use: the job runs without the endpoint, and says why
        other = _handle(busy.port)
        assert other.metrics_server is None and other.metrics_url is None
        assert any(f"cannot listen on 127.0.0.1 port {busy.port}" in text for _, text in other.master.events)
    finally:
        busy.close()
    assert _handle(0).metrics_server is None  # 0: no endpoint


def _reported(fams: dict[str, Family], family: str, suffix: str = "", **labels: str) -> bool:
    """Whether the series is there with a value above 0 (a replica reports once a second)."""
    fam = fams.get(family)
    return fam is not None and any(n == family + suffix and labels.items() <= ls.items() and v > 0
                                   for n, ls, v in fam.samples)


@pytest.mark.integration
def test_scrape_a_running_replicated_job_and_show_its_status(stack, spark, topic_prefix, capsys) -> None:
    """LiveRobin + Rhino, two replicas per partition: /metrics shows the sink writing, two live
    replicas everywhere and completed checkpoints; ``replication status`` shows the same job."""
    from ops.cli import main as cli_main
    from replication import run
    from replication.examples.ordered import verify_chains
    from replication.status import read_status
    from tests.ordered_runs import feed, read_output, source_topics

    name = f"{topic_prefix}prom"
    a, b = source_topics(stack, name)
    port = _free_port()
    conf = {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers,
            "spark.replication.enabled": "true", "spark.replication.mode": "liverobin",
            "spark.replication.rhino.enabled": "true", "spark.replication.rhino.checkpointEvery": "20",
            "spark.replication.metrics.port": str(port)}
    handle = run(build_ordered_job(a, b, f"{name}out", name=name), spark=spark, conf=conf)
    ids: list[str] = []
    feeder = threading.Thread(target=feed, args=(stack, a, b, ids), kwargs={"rounds": 30})
    try:
        assert handle.metrics_url is not None and handle.metrics_url.endswith(f":{port}/metrics")
        handle.wait_started(120)
        feeder.start()
        deadline = time.monotonic() + 30
        # until both sink partitions wrote, every partition has a completed checkpoint, and the
        # replicas checked below reported figures of records they had (each reports once a second)
        while True:
            code, ctype, body = _get(f"http://127.0.0.1:{port}/metrics")
            assert code == 200 and ctype == CONTENT_TYPE
            fams = parse(body)
            out = fams.get("replication_records_out_total")
            sinks = {(ls["partition"], ls["replica"]): v for _, ls, v in (out.samples if out else [])
                     if ls["task"] == "chain-sink"}
            cps = fams.get("replication_checkpoint_last_completed_id")
            if (len(sinks) == 4 and sinks[("0", "0")] > 0 and sinks[("1", "0")] > 0 and cps is not None
                    and len(cps.samples) == len(fams["replication_partition_replicas"].samples)
                    and _reported(fams, "replication_records_in_total", task="chain", partition="0", replica="1")
                    and _reported(fams, "replication_pulse", task="chain", partition="0", replica="0")
                    and _reported(fams, "replication_latency_seconds", "_count", task="chain-sink",
                                  partition="0", replica="0")):
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.3)
        live = fams["replication_partition_live_replicas"]
        assert len(live.samples) == 10 and all(v == 2 for _, _, v in live.samples)  # 5 tasks x 2 partitions
        assert all(ls["job"] == name for _, ls, _ in live.samples)
        assert fams["replication_workers_alive"].get() == 3 and fams["replication_workers_dead"].get() == 0
        assert all(v == 1 for _, _, v in fams["replication_replica_group_size"].samples)
        assert all(v >= 0 for _, _, v in fams["replication_checkpoint_age_seconds"].samples)
        assert fams["replication_pulse"].get(task="chain", partition="0", replica="0") > 0
        assert fams["replication_records_in_total"].get(task="chain", partition="0", replica="1") > 0
        assert fams["replication_latency_seconds"].get("_count", task="chain-sink", partition="0",
                                                        replica="0") > 0
        assert fams["replication_divergences_total"].get() == 0
        print("\n".join(line for line in body.splitlines() if "chain-sink" in line and "partition=\"0\"" in line
                        and "replica=\"0\"" in line and ("records_out" in line or "_count" in line
                                                         or 'le="0.0625"' in line)
                        or line.startswith(("replication_partition_live_replicas", "replication_workers"))))

        assert read_status(name).get("metrics_url") == handle.metrics_url
        time.sleep(0.6)  # the status file is rewritten at most every 0.5 s
        assert cli_main(["status", name]) == 0
        shown = capsys.readouterr().out
        assert f"job {name}: running" in shown and "ordering liverobin" in shown and "Rhino checkpoints on" in shown
        assert f"Prometheus metrics: {handle.metrics_url}" in shown
        for part in ("source-a[0]", "source-b[1]", "union-2[0]", "chain[1]", "chain-sink[0]", "chain-sink[1]"):
            assert re.search(rf"^{re.escape(part)}\s+r0\s+\d+\s+\d+\s", shown, re.M), (part, shown)
        assert len(re.findall(r"^\s+r1\s+\d+\s+\d+\s", shown, re.M)) == 10  # every partition's second replica
        for p in (0, 1):  # sink writers: replica 0 at the start, replica 1 its standby
            assert re.search(rf"^chain-sink\[{p}\]\s+r0\s+\d+\s+\d+\s+writer\s+live\s.*\n\s+r1\s+\d+\s+\d+\s+"
                             r"standby\s+live\s", shown, re.M), shown
        assert "LOST" not in shown
        assert re.search(r"^chain\[0\].* \d+ \(\d+\.\d s ago\)\s+\d+$", shown, re.M), shown
        assert cli_main(["status", name, "--json"]) == 0
        assert f'"job": "{name}"' in capsys.readouterr().out
        print(shown)
    except BaseException:
        if feeder.is_alive():
            feeder.join()
        handle.stop()
        raise
    feeder.join()
    result = handle.drain(timeout=120)
    assert result.status == "finished" and not result.divergences
    report = verify_chains(read_output(stack, f"{name}out"), ids)
    assert report.exact, report
    with pytest.raises(OSError):  # the endpoint closed with the job
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert read_status(name)["state"] == "finished"
