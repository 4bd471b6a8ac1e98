"""Durable checkpoints (issue 23): what an upload costs, and how long a resume takes to its first output.

    .venv/bin/python bench/durable.py [--parts upload,resume] [--sizes 10MB,100MB,1GB]
                                      [--resume-sizes 10MB,100MB] [--change 0.01,0.1] [--value-bytes 1000]
                                      [--rate 200] [--before 8] [--out bench/results/durable]

**upload** (no Spark, one process): a ``RocksDBStateBackend`` holding ``--sizes`` of state (keys of
``--value-bytes``) takes a full checkpoint, which is uploaded to a directory with ``DurableStore.upload``
as a worker's uploader does; then, per ``--change`` fraction, that share of the keys is rewritten and
a delta checkpoint is taken and uploaded.  Per upload: the bytes written to the directory (payload and
meta), the CPU seconds of the checkpoint itself (the instance thread's part, as in a job: writing the
increment file) and of the upload (the uploader thread's part: read, sha256, write), both as thread CPU
time, and the wall time of each.  Then the state is built back from the directory (``DurableStore.restore``:
the chain downloaded and applied, each increment's checksum and content digest checked), which is the
part of a resume that grows with the state.

**resume** (real Spark, ``local-cluster[3,1,512]``, the embedded broker): ``bench/handover.py``'s job (one
topic of 2 partitions -> ``key_by`` -> ``PaddedChain`` -> exactly-once sink), LiveRobin, replicated,
Rhino on, ``spark.replication.checkpointDir``; the state grown to ``--resume-sizes`` (every key's pad
written), then ``--rate`` events/s of load for ``--before`` seconds more; once a cut holds the state
(its chains add up to at least 90% of it), the job is stopped (``handle.stop()``, no drain: the new run goes on from the cut, as
after a crash), its Spark application too, and the job is started again, with the same name and
directory, in a new application (``app_start_s``: the session and its executors) while the load goes on.  Measured from
``run()``: *prepare* (``run()`` returned: the driver found the newest cut and verified every file it
needs, sha256 of the whole state; planning, the executors' warm-up, the Spark job submitted), *workers*
(``wait_started``: every worker registered, which each does after building its partitions' state from
the cut) and *first output* (the new run's sink wrote its first record, polled every 20 ms).  The output
of both runs is checked record by record (``bench.handover.verify``: every event once, every key's chain
links up, every event read the pad value it should).

**sss** (the peer, same session and broker): Spark Structured Streaming with the RocksDB state store
(changelog checkpointing) restarting from its ``checkpointLocation`` on the same amount of state: one
topic of 2 partitions read with ``bench/sss.py``'s Kafka source, ``groupBy(key).applyInPandasWithState``
keeping per key a hash chain and a pad (``--sss-pad`` bytes; as many keys as the size needs), output
written with ``foreachBatch``.  One event per key builds the state, then ``--rate`` events/s for
``--before`` s; the query is stopped, its application too, and a new query is started on the same
checkpoint location in a new application (``app_start_s``, as for this project): measured from
``start()`` to the first record the new query wrote (its ``sink_ts``), with ``start()`` itself as a part.  SSS's output is at least once; only the time is compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import handover as hb  # noqa: E402
from bench import restart as rs  # noqa: E402
from bench.common import forget_topics, format_row, one_line, print_plain_table, write_csv, write_machine  # noqa: E402

MB = 1 << 20
INSTANCE = (1, 0)
UPLOAD_COLUMNS = ("size", "state_bytes", "keys", "kind", "change", "keys_changed", "bytes_uploaded",
                  "upload_ratio", "checkpoint_cpu_s", "checkpoint_s", "upload_cpu_s", "upload_s",
                  "upload_mb_per_cpu_s", "restore_s", "restore_cpu_s")
SSS_COLUMNS = ("size", "state_bytes", "keys", "checkpoint_bytes", "app_start_s", "start_s", "to_first_output_s",
               "records", "error")
SSS_TRIGGER_MS = 100
RESUME_COLUMNS = ("size", "state_bytes", "exact", "outcome", "cut", "cut_bytes", "app_start_s", "prepare_s", "workers_s",
                  "first_output_s", "to_first_output_s", "produced", "error")


def parse_size(text: str) -> int:
    text = text.strip().upper()
    for unit, factor in (("GB", 1 << 30), ("MB", MB), ("KB", 1 << 10)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def size_label(size: int) -> str:
    return f"{size / (1 << 30):g}GB" if size >= 1 << 30 else f"{size / MB:g}MB"


# ------------------------------------------------------------------------------------------ upload
def _timed(fn: Any) -> tuple[Any, float, float]:
    """``fn()``: its result, thread CPU seconds and wall seconds."""
    cpu, wall = time.thread_time(), time.perf_counter()
    result = fn()
    return result, time.thread_time() - cpu, time.perf_counter() - wall


def upload_rows(size: int, changes: list[float], value_bytes: int, root: Path) -> list[dict[str, Any]]:
    from rhino_state import RocksDBStateBackend
    from rhino_state.durable import DurableStore

    keys = max(1, size // (value_bytes + 16))
    work = Path(tempfile.mkdtemp(prefix="durable-bench-", dir=root))
    rows = []
    try:
        store = DurableStore(str(work / "dir"), "bench")
        with RocksDBStateBackend(work / "db", instance=INSTANCE) as backend:
            for i in range(keys):
                backend.put(i % 128, b"k%011d" % i, os.urandom(value_bytes))
            cid, previous = 1, None
            plan = [("full", 0.0)] + [("delta", c) for c in changes]
            for kind, change in plan:
                changed = 0 if kind == "full" else max(1, int(keys * change))
                for i in range(changed):
                    j = (i * 7919) % keys
                    backend.put(j % 128, b"k%011d" % j, os.urandom(value_bytes))
                payload = work / f"{cid}.inc"
                meta, ck_cpu, ck_wall = _timed(lambda p=payload, c=cid, f=kind == "full": backend.checkpoint(
                    c, p, runtime=b"", full=f))
                uploaded, up_cpu, up_wall = _timed(lambda m=meta, p=payload, prev=previous: store.upload(m, p, prev))
                payload.unlink()
                meta_bytes = sum(os.path.getsize(f) for f in (work / "dir").rglob(f"{uploaded.file}.json"))
                _, re_cpu, re_wall = _timed(lambda f=uploaded.file, c=cid: store.restore(
                    INSTANCE, f, work / f"restored-{c}", scratch=work))
                shutil.rmtree(work / f"restored-{cid}", ignore_errors=True)
                sent = uploaded.size + meta_bytes
                rows.append({"size": size_label(size), "state_bytes": keys * (value_bytes + 16), "keys": keys,
                             "kind": kind, "change": change, "keys_changed": changed if kind == "delta" else keys,
                             "bytes_uploaded": sent, "upload_ratio": round(sent / (keys * (value_bytes + 16)), 4),
                             "checkpoint_cpu_s": ck_cpu, "checkpoint_s": ck_wall, "upload_cpu_s": up_cpu,
                             "upload_s": up_wall, "upload_mb_per_cpu_s": round(sent / MB / max(up_cpu, 1e-6), 1),
                             "restore_s": re_wall, "restore_cpu_s": re_cpu})
                print(format_row(rows[-1]), flush=True)
                previous, cid = uploaded.file, cid + 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


# ------------------------------------------------------------------------------------------ resume
class Sessions:
    """One Spark application at a time (``local-cluster[3,1,512]``); :meth:`new` stops the current one
    and starts another, as a job restarted after its driver died runs in a new application."""

    def __init__(self) -> None:
        self.spark: Any = None

    def new(self) -> float:
        """A new application; returns the seconds it took to start (session and executors)."""
        from replication.spark_cluster import build_session, stop_session

        if self.spark is not None:
            stop_session(self.spark)
            self.spark = None
        started = time.perf_counter()
        self.spark = build_session("local-cluster[3,1,512]", app_name="bench-durable")
        return time.perf_counter() - started

    def close(self) -> None:
        from replication.spark_cluster import stop_session

        if self.spark is not None:
            stop_session(self.spark)
            self.spark = None


def resume_row(stack: Any, sessions: Sessions, size: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from deploy.topics import create_topics
    from replication import run
    from rhino_state.durable import DurableStore

    bootstrap = stack.bootstrap_servers
    stamp = f"{int(time.time() * 1000) % 10**10}"
    name, topic, out = f"dur{stamp}", f"dur{stamp}-in", f"dur{stamp}-out"
    checkpoints = root / f"checkpoints-{stamp}"
    conf = {**hb.job_conf(bootstrap, None), "spark.replication.rhino.enabled": "true",
            "spark.replication.checkpointDir": str(checkpoints)}
    if args.fetch_wait_ms is not None:
        conf["spark.replication.kafka.consumer.fetch.wait.max.ms"] = str(args.fetch_wait_ms)
    model = hb.state_model(size, argparse.Namespace(keys_per_vnode=1, value_bytes=args.value_bytes), conf)
    create_topics(bootstrap, {topic: 2, out: 2})
    feeder = hb.Feeder(bootstrap, topic, model.keys, args.rate)
    store = DurableStore(str(checkpoints), name)
    row: dict[str, Any] = {"size": size_label(size), "state_bytes": model.total_bytes}
    marks: dict[str, float] = {}
    error = failure = None
    second = None

    def job() -> Any:
        return hb.build_handover_job(topic, out, name, model.entries, model.value_bytes)

    first = run(job(), spark=sessions.spark, conf=conf)
    try:
        first.wait_started(120)
        feeder.start()
        hb.wait_for_state(first, feeder, len(model.keys), args.before + size / MB * args.build_s_per_mb)

        def cut_holds_the_state() -> bool:
            numbers = store.cut_numbers()
            return bool(numbers) and store.verify(store.read_cut(numbers[-1]), checksums=False) >= 0.9 * size

        rs._wait_for(cut_holds_the_state, 600, "no cut held the state within 600 s")
        first.stop(60)
        cut = store.read_cut(max(store.cut_numbers()))
        row.update(cut=cut.number, cut_bytes=store.verify(cut, checksums=False), app_start_s=round(sessions.new(), 3))
        marks["launch"] = time.time()
        second = run(job(), spark=sessions.spark, conf=conf)
        marks["prepared"] = time.time()
        second.wait_started(600)
        marks["registered"] = time.time()
        _wait_for_output(second, 120)
        marks["first_output"] = time.time()
        time.sleep(3)
    except Exception as err:  # noqa: BLE001 - recorded in the row
        error = one_line(err, 300)
    finally:
        produced, load_error = hb.stop_feeder(feeder)
        error = error or load_error
        if first.running:
            first.stop(60)
    if second is not None:
        _, failure = rs.finish_job(second)
    outputs: list[dict] = []
    if produced:
        try:
            outputs, _ = rs.read_outputs(bootstrap, out)
        except Exception as err:  # noqa: BLE001
            error = error or f"reading the output: {one_line(err, 300)}"
    verdict = hb.verify(outputs, feeder.ids, model.entries, failure) if produced else None
    shutil.rmtree(checkpoints, ignore_errors=True)
    forget_topics(bootstrap, stamp)

    def span(a: str, b: str) -> float | str:
        return round(marks[b] - marks[a], 3) if a in marks and b in marks else ""

    row.update(exact="yes" if verdict is not None and verdict.exact else "no",
               outcome=verdict.outcome if verdict is not None else (failure or "nothing produced"),
               prepare_s=span("launch", "prepared"), workers_s=span("prepared", "registered"),
               first_output_s=span("registered", "first_output"), to_first_output_s=span("launch", "first_output"),
               produced=produced, error=error or "")
    print(format_row(row), flush=True)
    return row


def _progress(handle: Any) -> str:
    """Each instance's records in and out, pulse and checkpoint, as ``name in/out pPULSE cID``."""
    return " ".join(f"{name} {m.records_in}/{m.records_out} p{m.pulse} c{m.checkpoint_id}"
                    for name, m in sorted(handle.master.snapshot().items()))


def _wait_for_output(handle: Any, timeout: float) -> None:
    """Until the resumed run wrote its first output record; its progress printed every 10 s (where
    it was when it gave up is in the log)."""
    rs._wait_for(lambda: handle.sink_metrics().records_out > 0, timeout,
                 f"the new run wrote nothing within {timeout:g} s",
                 on_tick=lambda: print(f"resumed run, no output yet: {_progress(handle)}", flush=True))


# ------------------------------------------------------------------------------------------ sss
SSS_EVENT_SCHEMA = "id string, key string, ts long"
SSS_OUTPUT_SCHEMA = "key string, n long, id string, h string, ts long"
SSS_STATE_SCHEMA = "head string, n long, pad binary"


def sss_chain_with_pad(pad_bytes: int) -> Any:
    """applyInPandasWithState function: per key a hash chain and a pad of ``pad_bytes`` (written by the
    key's first event, kept in the state as it is)."""

    def fn(key: tuple, pdfs: Any, state: Any) -> Any:
        import hashlib

        import pandas as pd

        from replication.examples.ordered import chain_step

        frames = [f for f in pdfs if len(f)]
        if not frames:
            return
        events = pd.concat(frames, ignore_index=True).sort_values("id", kind="stable")
        if state.exists:
            head, n, pad = str(state.get[0]), int(state.get[1]), bytes(state.get[2])
        else:
            head, n, pad = "", 0, hashlib.shake_128(str(key[0]).encode()).digest(pad_bytes)
        rows = []
        for event_id, ts in zip(events["id"], events["ts"], strict=True):
            n += 1
            head = chain_step(head, str(event_id))
            rows.append((str(key[0]), n, str(event_id), head, int(ts)))
        state.update((head, n, pad))
        yield pd.DataFrame(rows, columns=["key", "n", "id", "h", "ts"])

    return fn


class SinkTimes:
    """Reads the output topic from its start, keeping each record's ``sink_ts`` header, until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        import threading

        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.times: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sss-sink-times", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"durable-{os.getpid()}",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 20})
        try:
            consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
            while not self.stop.is_set():
                for m in consumer.consume(num_messages=5000, timeout=0.1):
                    if m.error() is None:
                        self.times.append(float(dict(m.headers() or ())["sink_ts"]))
        finally:
            consumer.close()

    def first_after(self, t: float) -> float | None:
        return min((x for x in list(self.times) if x >= t), default=None)


def sss_row(stack: Any, sessions: Sessions, size: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from bench import sss
    from deploy.topics import create_topics, produce

    bootstrap = stack.bootstrap_servers
    stamp = f"{int(time.time() * 1000) % 10**10}"
    topic, out = f"dsss{stamp}-in", f"dsss{stamp}-out"
    keys = [f"k{i}" for i in range(max(1, size // args.sss_pad))]
    create_topics(bootstrap, {topic: 2, out: 2})
    confs = {"spark.sql.streaming.stateStore.providerClass": sss.ROCKSDB_PROVIDER,
             "spark.sql.shuffle.partitions": "2",
             "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}
    checkpoint = root / f"sss-checkpoint-{stamp}"
    sink_times = SinkTimes(bootstrap, out, 2)
    feeder = hb.Feeder(bootstrap, topic, keys, args.rate)
    row: dict[str, Any] = {"size": size_label(size), "state_bytes": len(keys) * args.sss_pad, "keys": len(keys)}
    error = ""

    def start() -> Any:
        spark = sessions.spark
        sss._register_source(spark)
        sss._set_confs(spark, confs)
        stream = (spark.readStream.format(sss.SOURCE_NAME).option("bootstrap", bootstrap).option("subscribe", topic)
                  .load().select(F.from_json("value", SSS_EVENT_SCHEMA).alias("e")).select("e.*"))
        job = stream.groupBy("key").applyInPandasWithState(
            sss_chain_with_pad(args.sss_pad), SSS_OUTPUT_SCHEMA, SSS_STATE_SCHEMA, "Update",
            GroupStateTimeout.NoTimeout)
        return (job.writeStream.outputMode("update").foreachBatch(sss.make_batch_writer(bootstrap, out, "key"))
                .trigger(processingTime=f"{SSS_TRIGGER_MS} milliseconds")
                .option("checkpointLocation", str(checkpoint)).start())

    query = None
    try:
        produce(bootstrap, topic, [(k.encode(), json.dumps({"id": f"init-{k}", "key": k, "ts": 0}).encode())
                                   for k in keys])
        query = start()
        rs._wait_for(lambda: len(sink_times.times) >= len(keys), 600, "SSS did not write every key's first event")
        feeder.start()
        time.sleep(args.before)
        query.stop()
        query = None
        row["checkpoint_bytes"] = rs.dir_bytes(checkpoint)
        row["app_start_s"] = round(sessions.new(), 3)
        launched = time.time()
        query = start()
        row["start_s"] = round(time.time() - launched, 3)
        rs._wait_for(lambda: sink_times.first_after(launched) is not None, 600, "the restarted query wrote nothing")
        row["to_first_output_s"] = round(sink_times.first_after(launched) - launched, 3)
        time.sleep(2)
    except Exception as err:  # noqa: BLE001 - recorded in the row
        error = one_line(err, 300)
    finally:
        hb.stop_feeder(feeder)
        if query is not None:
            query.stop()
        sink_times.stop.set()
        sink_times.thread.join(5)
        shutil.rmtree(checkpoint, ignore_errors=True)
        forget_topics(bootstrap, stamp)
    row.update(records=len(sink_times.times), error=error)
    print(format_row(row), flush=True)
    return row


# ------------------------------------------------------------------------------------------ the command
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="upload,resume,sss", help="upload, resume, sss (default all three)")
    ap.add_argument("--sizes", default="10MB,100MB,1GB", help="state sizes of the upload part")
    ap.add_argument("--resume-sizes", default="10MB,100MB", help="state sizes of the resume part")
    ap.add_argument("--change", default="0.01,0.1", help="fractions of the keys rewritten before a delta")
    ap.add_argument("--value-bytes", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=200.0, help="events/s of load in the resume part")
    ap.add_argument("--before", type=float, default=8.0, help="seconds of load before the stop")
    ap.add_argument("--build-s-per-mb", type=float, default=0.5,
                    help="seconds per MB of state allowed for building it before the stop (resume part)")
    ap.add_argument("--fetch-wait-ms", type=int, default=None,
                    help="the sources' fetch.wait.max.ms in the resume part (default: the runtime's)")
    ap.add_argument("--sss-pad", type=int, default=16 * 1024, help="bytes of pad per key in the SSS job")
    ap.add_argument("--out", default="bench/results/durable")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_machine(out)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    scratch = Path(tempfile.mkdtemp(prefix="durable-"))
    bad = []
    try:
        if "upload" in parts:
            uploads = []
            for size in (parse_size(s) for s in args.sizes.split(",")):
                uploads += upload_rows(size, [float(c) for c in args.change.split(",")], args.value_bytes, scratch)
            write_csv(out / "upload.csv", uploads, digits=4)
            print_plain_table("durable checkpoints: one upload", uploads, UPLOAD_COLUMNS)
            _plot_upload(out, uploads)
        if parts & {"resume", "sss"}:
            resumes: list[dict[str, Any]] = []
            restarts: list[dict[str, Any]] = []
            try:
                _spark_rows(args, scratch, parts, resumes, restarts)
            finally:  # interrupted too: what was measured is written
                if resumes:
                    write_csv(out / "resume.csv", resumes, digits=3)
                if restarts:
                    write_csv(out / "sss_restart.csv", restarts, digits=3)
            if resumes:
                print_plain_table("durable checkpoints: resume to the first output", resumes, RESUME_COLUMNS)
            if restarts:
                print_plain_table("Spark Structured Streaming: restart to the first output", restarts, SSS_COLUMNS)
            bad = [f"{r['size']}: {r['outcome']} {r['error']}".strip() for r in resumes if r["exact"] != "yes"]
            bad += [f"sss {r['size']}: {r['error']}" for r in restarts if r["error"]]
            _plot_resume(out, resumes, restarts)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if bad:
        print(f"NOT OK: {'; '.join(bad)}", flush=True)
    return 1 if bad else 0


def _spark_rows(args: argparse.Namespace, scratch: Path, parts: set[str], rows: list[dict[str, Any]],
                sss_rows: list[dict[str, Any]]) -> None:
    """The resume rows and SSS's (appended as measured), each size in turn on one broker."""
    from deploy.stack import EmbeddedStack, require_java17

    require_java17()
    with EmbeddedStack() as stack:
        sessions = Sessions()
        try:
            sessions.new()
            for size in (parse_size(s) for s in args.resume_sizes.split(",")):
                if "resume" in parts:
                    rows.append(resume_row(stack, sessions, size, args, scratch))
                if "sss" in parts:
                    sss_rows.append(sss_row(stack, sessions, size, args, scratch))
        finally:
            sessions.close()


def _plot_resume(out: Path, rows: list[dict[str, Any]], sss_rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, sel, col, marker in (("this project: resume from checkpointDir", rows, "to_first_output_s", "o"),
                                    ("SSS: restart from checkpointLocation", sss_rows, "to_first_output_s", "s")):
        pts = [(r["state_bytes"] / MB, r[col]) for r in sel if r.get(col) not in ("", None)]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("state (MB)")
    ax.set_ylabel("start -> first output (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "resume.png", dpi=110)
    plt.close(fig)


def _plot_upload(out: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for kind, change in sorted({(r["kind"], r["change"]) for r in rows}):
        sel = [r for r in rows if (r["kind"], r["change"]) == (kind, change)]
        label = "full snapshot" if kind == "full" else f"delta, {change:.0%} of keys changed"
        xs = [r["state_bytes"] / MB for r in sel]
        ax1.plot(xs, [r["bytes_uploaded"] / MB for r in sel], marker="o", label=label)
        ax2.plot(xs, [r["upload_cpu_s"] + r["checkpoint_cpu_s"] for r in sel], marker="o", label=label)
    for ax, what in ((ax1, "MB uploaded"), (ax2, "CPU s (checkpoint + upload)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("state (MB)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle("durable checkpoints: one upload by state size and change rate")
    fig.tight_layout()
    fig.savefig(out / "upload.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
