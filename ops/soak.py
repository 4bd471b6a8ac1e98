"""The fault soak: an order-sensitive two-source job under steady load while a seeded schedule of
single faults hits it, then every output record checked by a reader built on another Kafka client.

``replication soak --mode liverobin --duration 600 --seed 7`` starts the embedded stack and a
``local-cluster`` Spark of ``--executors`` executor JVMs (``--workers`` of them host the job; the
others are warm spares on which Spark relaunches a lost worker at once, while it starts a new
executor JVM in the background, tens of seconds on two loaded cores), runs a union of two topics into a keyed
process function with value and map state (a hash chain per key: the output depends on the order
in which both replicas consume their inputs) and a sink, replicated with Rhino checkpoints, feeds
it at ``--rate`` events/s with a malformed record every ``--bad-every``, and every ``--gap``
seconds (once the job is healthy again: two live replicas of every partition, every partition
restorable; and back to full strength: every worker live again) injects one fault drawn from the
mode's catalogue with ``random.Random(seed)``:

* ``kill-executor``: SIGKILL the executor JVM of a random replica;
* ``kill-python``: SIGKILL only the Python worker of a random replica;
* ``pause-short`` / ``pause-long``: SIGSTOP an executor for half / two and a half times
  ``failureTimeout``, then SIGCONT it;
* ``kill-two``: kill the executors of two random replicas a few seconds apart;
* ``kill-generator`` (LiveRobin): kill the heartbeat generators, start one again a second later;
* ``kill-leader`` (KaZoo): kill the executor of a partition's leader replica;
* ``restart-zookeeper`` (KaZoo): crash ZooKeeper and start it again a second later.

Between the faults, at random moments, it moves vnodes of the chain, rescales it onto its spare
third partition and back, or rebalances it (:mod:`ops.soak_handovers`; ``--no-handovers``
turns them off): each must complete, or be cancelled or refused cleanly.  ``--no-rhino`` runs
without checkpoints; no lost replica is restored then, so only the faults that lose none are
drawn (``pause-short``, ``kill-generator``, ``restart-zookeeper``).

At the end it drains the job and reads the output and dead-letter topics with ``kafka-python``
(the runtime uses confluent-kafka): every input event exactly once, each key's records a gapless
hash chain in the order of its sources, the map state's counts consistent, every malformed
record dead-lettered exactly once, both replicas of every partition ending with equal state, no
divergence.  It prints the faults injected and survived, records lost and duplicated, recovery
times and the seed; the exit code says whether everything held.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any

from ops import chaos
from ops.soak_check import compare_replicas, read_topic, verify
from ops.soak_handovers import HandoverMover
from ops.soak_report import Fault, SoakReport
from replication.api import Job
from replication.examples.ordered import chain_step
from replication.functions import KeyedProcessFunction, ProcessContext, RuntimeContext
from replication.metrics import drain_text, window_text

log = logging.getLogger(__name__)

SOURCES = ("a", "b")
FAULTS = {
    "liverobin": ("kill-executor", "kill-python", "pause-short", "pause-long", "kill-two", "kill-generator"),
    "kazoo": ("kill-executor", "kill-python", "pause-short", "pause-long", "kill-two", "kill-leader",
              "restart-zookeeper"),
}
# With Rhino off a lost replica is not restored, so the next fault could take its twin: only the
# faults that lose no replica
WITHOUT_RHINO = ("pause-short", "kill-generator", "restart-zookeeper")
FAILURE_TIMEOUT_MS = 2_000
STAGES = ("lost", "restoring", "catching up", "not restorable")  # what unhealthy() says, in order
HEALTHY_TIMEOUT_S = 90.0  # a fault not recovered from within this is not survived
HANDOVER_JOIN_S = 240.0  # a handover still running at the end: its timeout, plus a committed step's completion
SLOW_S = 20.0  # a fault not recovered from within this: the replicas' figures are printed
TRAIL = 16  # why-not-healthy changes kept per fault (JSON report): the first and the latest


# -- the job -----------------------------------------------------------------------------------

class ChainWithCounts(KeyedProcessFunction):
    """Per key, a hash chain over its events (value state) and how many came from each source (map
    state); one output record per event."""

    def open(self, ctx: RuntimeContext) -> None:
        self.head = ctx.value_state("head", default="")
        self.n = ctx.value_state("n", default=0)
        self.by_source = ctx.map_state("by_source")

    def process(self, event: dict, ctx: ProcessContext) -> Iterable[dict]:
        prev = self.head.value()
        h = chain_step(prev, event["id"])
        n = self.n.value() + 1
        source = event["id"].split("-", 1)[0]
        seen = (self.by_source.get(source) or 0) + 1
        self.head.update(h)
        self.n.update(n)
        self.by_source.put(source, seen)
        yield {"key": ctx.key, "n": n, "id": event["id"], "prev": prev, "h": h, "source": source, "seen": seen}


def build_soak_job(topic_a: str, topic_b: str, out_topic: str, name: str) -> Job:
    job = Job(name)
    a = job.source(topic_a, deserializer="json", timestamp=lambda e: e["ts"], name="source-a")
    b = job.source(topic_b, deserializer="json", timestamp=lambda e: e["ts"], name="source-b")
    # a third, spare partition of the chain: the soak's handovers rescale onto it and back
    (a.union(b).key_by(lambda e: e["key"]).process(ChainWithCounts(), name="chain", max_parallelism=3)
     .new_task().sink(out_topic, serializer="json", key_serializer="str", name="chain-sink"))
    return job


# -- the load ----------------------------------------------------------------------------------

class Feeder:
    """Produces ``rate`` events/s over the two topics (b at half a's rate), 40 keys, and a
    malformed record every ``bad_every``; remembers every event id and where each malformed
    record landed (from the delivery reports)."""

    def __init__(self, bootstrap: str, topics: dict[str, str], rate: float, bad_every: int) -> None:
        from confluent_kafka import Producer

        self.topics, self.rate, self.bad_every = topics, rate, bad_every
        # batches of a quarter of a second: the embedded broker lists every batch of a partition on
        # each fetch that returns records, so every reader of a source partition (two replicas and
        # the heartbeat generator) costs it more with every batch the soak has fed; with batches of a
        # tenth of a second that took most of a core by the ninth minute (docs/embedded-broker.md)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 250, "acks": "all",
                                  "enable.idempotence": True})
        self.ids: list[str] = []
        self.malformed: set[tuple[str, int, int]] = set()
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-feeder", daemon=True)

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.producer.flush(30)

    def _delivered(self, bad: bool) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:
            if err is not None:
                self.failed += 1
            elif bad:
                self.malformed.add((msg.topic(), msg.partition(), msg.offset()))
        return report

    def _run(self) -> None:
        sent, started = 0, time.monotonic()
        counts = dict.fromkeys(SOURCES, 0)
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while sent < due:
                sent += 1
                source = "a" if sent % 3 else "b"  # b at half a's rate
                topic = self.topics[source]
                if self.bad_every and sent % self.bad_every == 0:
                    self.producer.produce(topic, value=b'{"broken": ', key=b"bad", on_delivery=self._delivered(True))
                    continue
                i = counts[source]
                counts[source] += 1
                event_id = f"{source}-{i}"
                key = f"k{(i * 7 + (0 if source == 'a' else 3)) % 40}"
                value = json.dumps({"id": event_id, "key": key, "ts": int(time.time() * 1000)}).encode()
                self.producer.produce(topic, value=value, key=key.encode(), on_delivery=self._delivered(False))
                self.ids.append(event_id)
            self.producer.poll(0)
            time.sleep(0.005)


# -- the faults --------------------------------------------------------------------------------

class NoTarget(Exception):
    """No process to hit right now (its worker is being relaunched): the fault is drawn again later."""


class Injector:
    """Picks and injects faults on a running job (the handle, its status file and the stack)."""

    def __init__(self, handle: Any, stack: Any, rnd: random.Random) -> None:
        self.handle, self.stack, self.rnd = handle, stack, rnd
        self.struck_at: float | None = None  # when the last fault's first signal went out
        self.last_struck_at: float | None = None  # and its last one

    def _strike(self) -> None:
        """A fault's clock starts as its (first) signal goes out, not while its target is looked for."""
        self.last_struck_at = time.monotonic()
        if self.struck_at is None:
            self.struck_at = self.last_struck_at

    def _replicas(self) -> list[str]:
        from replication.status import read_status

        status = read_status(self.handle.job.name)
        alive = {w for w, info in status.get("workers", {}).items() if info.get("alive")}
        replicas = sorted(r for r, e in status.get("replicas", {}).items() if str(e["worker"]) in alive)
        if not replicas:
            raise NoTarget("no replica on a live worker")
        return replicas

    def _locate(self, replica: str) -> Any:
        return chaos.locate(replica, job=self.handle.job.name)

    def _kill(self, replica: str) -> tuple[str, int]:
        target = self._locate(replica)
        self._strike()
        chaos.kill_executor(target)
        return f"executor {target.executor} of {replica}", target.worker

    def _lost(self, worker: int) -> Callable[[], bool]:
        """Whether the driver has noticed that ``worker``'s current attempt is gone."""
        master = self.handle.master
        attempt = master.workers[worker].attempt

        def noticed() -> bool:
            with master.locked():
                return worker in master.dead or master.workers[worker].attempt != attempt
        return noticed

    def inject(self, kind: str) -> tuple[str, list[Callable[[], bool]]]:
        """Inject ``kind``; what was hit, and the conditions that say the driver noticed it.
        Raises NoTarget when the process to hit is not there now (the soak draws again later)."""
        self.struck_at = self.last_struck_at = None
        try:
            return self._inject(kind)
        except chaos.ChaosError as exc:
            raise NoTarget(str(exc)) from exc

    def _inject(self, kind: str) -> tuple[str, list[Callable[[], bool]]]:
        replica = self.rnd.choice(self._replicas())
        if kind == "kill-executor":
            what, worker = self._kill(replica)
            return what, [self._lost(worker)]
        if kind == "kill-python":
            target = self._locate(replica)
            noticed = self._lost(target.worker)
            self._strike()
            chaos.kill_python(target)
            return f"python worker {target.python_pid} of {replica} (executor {target.executor})", [noticed]
        if kind in ("pause-short", "pause-long"):
            target = self._locate(replica)
            noticed = self._lost(target.worker)
            pause_s = FAILURE_TIMEOUT_MS / 1000 * (0.5 if kind == "pause-short" else 2.5)
            self._strike()
            chaos.pause_executor(target)
            resumed = threading.Event()
            threading.Timer(pause_s, lambda: (chaos.resume_executor(target), resumed.set())).start()
            return (f"executor {target.executor} of {replica} paused {pause_s:.1f}s",
                    [noticed] if kind == "pause-long" else [resumed.is_set])
        if kind == "kill-two":
            first, w1 = self._kill(replica)
            noticed = [self._lost(w1)]
            time.sleep(self.rnd.uniform(4.0, 6.0))
            others = [r for r in self._replicas() if self._locate(r).worker != w1]
            if not others:
                return f"{first}, then nothing (no other executor)", noticed
            second, w2 = self._kill(self.rnd.choice(others))
            return f"{first}, then {second}", [*noticed, self._lost(w2)]
        if kind == "kill-generator":
            self._strike()
            killed = self.handle.kill_pulse_generators()
            time.sleep(1.0)
            self.handle.start_pulse_generator()
            return f"heartbeat generators {killed}, one started again 1 s later", []
        if kind == "kill-leader":
            live = set(self._replicas())
            leaders = [name for name, m in self.handle.master.snapshot().items()
                       if m.leader and not m.finished and name in live]
            what, worker = self._kill(self.rnd.choice(leaders) if leaders else replica)
            return what + (" (a KaZoo leader)" if leaders else ""), [self._lost(worker)]
        if kind == "restart-zookeeper":
            self._strike()
            self.stack.restart_zookeeper(down_s=1.0)
            return "ZooKeeper, down 1 s", []
        raise ValueError(f"unknown fault {kind!r}")


def live_workers(handle: Any) -> int:
    """The job's workers registered and not dead now."""
    master = handle.master
    with master.locked():
        return sum(1 for w in master.workers if w not in master.dead)


def _back_to_full_strength(handle: Any, workers: int, deadline: float) -> bool:
    """Wait until every one of the job's ``workers`` is live again (Spark relaunched the lost ones:
    a new executor JVM takes tens of seconds on two loaded cores), at most until ``deadline``.  The
    next fault then hits a cluster of full size, as a single fault does; one that hits it short of
    workers is a fault on top of the last (two kills in a row on four workers can leave one)."""
    while live_workers(handle) < workers and time.monotonic() < deadline and not handle.master.failure:
        time.sleep(0.1)
    return live_workers(handle) >= workers


def unhealthy(handle: Any) -> str:
    """Why the job is not healthy yet ("" once it is): two live replicas of every partition, none
    lost, restoring or catching up, and every partition restorable from a checkpoint a live
    worker holds (so the next fault is masked too)."""
    master = handle.master
    with master.locked():
        label = master.replica_label
        if master.failure:
            return f"failed: {master.failure}"
        if master.lost:
            return "lost: " + ", ".join(label(*r) for r in sorted(master.lost))
        if master.restores.restoring:
            return "restoring: " + ", ".join(label(*r) for r in sorted(master.restores.restoring))
        if master.restores.catching_up:
            return "catching up: " + ", ".join(rec["replica"] for rec in master.restores.catching_up.values())
        rhino = master.rhino
        if rhino is None:
            return ""

        def held(cp: Any) -> str:
            return "none" if cp is None else f"{cp.checkpoint_id} on {sorted(cp.holders)}"

        bare = [f"{master.plan.task(t).name}[{p}] (safe {held(rhino.restore_point((t, p)))}, latest "
                f"{held(rhino.completed.get((t, p)))}, group {rhino.groups.get((t, p))}, replicas on "
                f"{sorted(rhino.replica_workers((t, p)))})"
                for t, p in rhino.instances() if not rhino.survives_a_loss((t, p), master.drained)]
        if not bare:
            return ""
        # a restore's pin holds its upstreams' safe checkpoints back too
        pins = [f"{master.plan.task(t).name}[{p}] to {cp.checkpoint_id} by r{rhino.pinned_by.get((t, p))}"
                for (t, p), cp in sorted(rhino.pinned.items())]
        return "not restorable: " + ", ".join(bare) + (f"; pinned: {', '.join(pins)}" if pins else "")


def say_replicas(handle: Any, say: Callable[[str], None], what: str) -> None:
    """Where each unfinished replica stands (for a fault not recovered from, or a failed drain)."""
    for name, m in sorted(handle.master.snapshot().items()):
        if not m.finished:
            say(f"   {what}: {name}: in {m.records_in}, queue {m.queue_batches}, pulse {m.pulse}, "
                f"leader {m.leader}, order epoch {m.order_epoch}, orders {m.orders_accepted}, "
                f"checkpoint {m.checkpoint_id}, restored from {m.restored_from}"
                + (f", {w}" if (w := window_text(m)) else "") + (f", {d}" if (d := drain_text(m)) else ""))


def healthy(handle: Any) -> bool:
    return not unhealthy(handle)


# -- the run -------------------------------------------------------------------------------------

def fault_catalogue(mode: str, faults: Iterable[str] | None, rhino: bool = True) -> tuple[str, ...]:
    """The faults a soak of ``mode`` draws from: ``faults`` (all of the mode's when empty); raises
    ValueError, in one line, for any the mode does not have.  Without ``rhino``: only faults that
    lose no replica."""
    catalogue = FAULTS[mode] if rhino else tuple(f for f in FAULTS[mode] if f in WITHOUT_RHINO)
    chosen = tuple(faults or ()) or catalogue
    unknown = sorted(set(chosen) - set(catalogue))
    if unknown:
        where = f"the {mode} catalogue" + ("" if rhino else " without Rhino (faults that lose no replica)")
        raise ValueError(f"{', '.join(unknown)} not in {where} ({', '.join(catalogue)})")
    return chosen


def run_soak(mode: str, duration_s: float, seed: int, rate: float = 300.0, executors: int = 5, workers: int = 4,
             gap_s: float = 12.0, bad_every: int = 250, say: Callable[[str], None] = print,
             faults: tuple[str, ...] | None = None, rhino_replicas: int = 1, rhino: bool = True,
             handovers: bool = True) -> SoakReport:
    """Run one soak (its own stack and Spark) and verify it; see the module docstring.  ``faults``
    narrows the mode's catalogue (default: all of it); ``rhino_replicas``: the workers holding
    each partition's checkpoints; ``rhino``: checkpoints on; ``handovers``: move, rescale and
    rebalance the chain's vnodes between the faults."""
    catalogue = fault_catalogue(mode, faults, rhino)
    from deploy.stack import EmbeddedStack, require_java17
    from replication.spark_cluster import build_session, stop_session

    require_java17()
    embedded = EmbeddedStack()
    with embedded:
        spark = build_session(f"local-cluster[{executors},1,512]", app_name=f"replication-soak-{mode}")
        try:
            report = SoakReport(mode, seed, duration_s, rate, executors, workers, rhino_replicas=rhino_replicas,
                                rhino=rhino)
            return _soak(embedded, spark, report, gap_s, bad_every, say, catalogue, handovers)
        finally:
            stop_session(spark)


def _soak(embedded: Any, spark: Any, report: SoakReport, gap_s: float, bad_every: int, say: Callable[[str], None],
          catalogue: tuple[str, ...], handovers: bool) -> SoakReport:
    from deploy.topics import create_topics
    from replication import JobFailedError, run

    stack = embedded.endpoints  # (the EmbeddedStack itself restarts ZooKeeper)
    mode, seed, duration_s, rate = report.mode, report.seed, report.duration_s, report.rate
    rnd = random.Random(seed)
    name = f"soak-{mode}-{uuid.uuid4().hex[:6]}"
    topics = {s: f"{name}-{s}" for s in SOURCES}
    out_topic = f"{name}-out"
    create_topics(stack.bootstrap_servers, {topics["a"]: 2, topics["b"]: 2, out_topic: 2})
    conf = {"spark.replication.kafka.bootstrapServers": stack.bootstrap_servers,
            "spark.replication.enabled": "true", "spark.replication.mode": mode,
            "spark.replication.rhino.enabled": str(report.rhino).lower(),
            "spark.replication.failureTimeout": f"{FAILURE_TIMEOUT_MS}ms",
            "spark.replication.workers": str(report.workers),
            "spark.replication.rhino.replicas": str(report.rhino_replicas)}
    if mode == "kazoo":
        conf.update({"spark.replication.zookeeper.connect": stack.zookeeper_connect,
                     "spark.replication.rhino.checkpointEvery": "50"})
    else:
        # pulses: about a checkpoint every 1.5 s (the generator writes a pulse when a source grew, and the
        # feeder's batches make that about 13 times a second; a handover adds one every 50 ms or so)
        conf["spark.replication.rhino.checkpointEvery"] = "20"
    job = build_soak_job(topics["a"], topics["b"], out_topic, name)
    handle = run(job, spark=spark, conf=conf)
    handle.wait_started(180)
    feeder = Feeder(stack.bootstrap_servers, topics, rate, bad_every).start()
    injector = Injector(handle, embedded, rnd)
    started = time.monotonic()
    # its own generator: the fault schedule of a seed is the same with handovers or without
    mover = HandoverMover(handle, "chain", random.Random(seed + 1), started, say) if handovers else None
    say(f"== {name}: seed {seed}, {report.setup}, {rate:.0f} events/s, faults every {gap_s:.0f} s for "
        f"{duration_s:.0f} s" + (", handovers between them" if handovers else ""))
    try:
        next_at = started + rnd.uniform(0.5, 1.0) * gap_s
        while next_at < started + duration_s - 10 and not handle.master.failure:
            if mover is not None and next_at - time.monotonic() > 2.0:
                # a handover at a random moment before the next fault (it may still run when that lands)
                time.sleep(mover.rnd.uniform(0.0, next_at - time.monotonic() - 2.0))
                mover.start_one()
            time.sleep(max(0.0, next_at - time.monotonic()))
            kind = rnd.choice(catalogue)
            fault = Fault(kind, time.monotonic() - started)
            injected = time.monotonic()
            try:
                fault.target, noticed = injector.inject(kind)
                injected = injector.struck_at or injected
            except NoTarget as exc:
                fault.note = f"not injected: {exc}"
                say(f"   {fault.at_s:6.1f}s {kind}: {fault.note}")
                next_at = time.monotonic() + 2.0
                continue
            report.faults.append(fault)
            deadline = time.monotonic() + HEALTHY_TIMEOUT_S
            while not all(n() for n in noticed) and time.monotonic() < deadline and not handle.master.failure:
                time.sleep(0.05)  # (healthy before the driver noticed the fault means nothing)
            fault.phases["noticed"] = time.monotonic() - injected
            fault.last_signal_s = (injector.last_struck_at or injected) - injected
            told_slow = False
            while True:
                if "caught_up" not in fault.phases:
                    live = live_workers(handle)
                    fault.live_workers = live if fault.live_workers is None else min(fault.live_workers, live)
                why = unhealthy(handle)
                if why and (not fault.trail or fault.trail[-1][1] != why):
                    if len(fault.trail) >= TRAIL:
                        del fault.trail[TRAIL // 2]
                    fault.trail.append((round(time.monotonic() - injected, 1), why))
                stage = why.split(":", 1)[0]
                rank = STAGES.index(stage) if stage in STAGES else len(STAGES)
                for phase, after in (("restored", 1), ("caught_up", 2)):
                    if rank > after and phase not in fault.phases:
                        fault.phases[phase] = time.monotonic() - injected
                if not why or time.monotonic() >= deadline or handle.master.failure:
                    break
                if time.monotonic() - injected > SLOW_S and not told_slow:
                    told_slow = True
                    say(f"   {fault.at_s:6.1f}s {kind}: not healthy after {SLOW_S:.0f} s: {why}")
                    say_replicas(handle, say, "replica")
                time.sleep(0.1)
            if healthy(handle):
                fault.recovered_s, fault.survived = time.monotonic() - injected, True
            else:
                fault.note = unhealthy(handle)
            say(f"   {fault.at_s:6.1f}s {kind}: {fault.target}: "
                + (f"healthy again after {fault.recovered_s:.2f}s" if fault.survived
                   else f"NOT RECOVERED ({fault.note})"))
            full = (_back_to_full_strength(handle, report.workers, injected + HEALTHY_TIMEOUT_S) if fault.survived
                    else live_workers(handle) >= report.workers)
            if full:
                fault.phases["full_strength"] = time.monotonic() - injected
            elif fault.survived:
                say(f"   {fault.at_s:6.1f}s {kind}: {live_workers(handle)} of {report.workers} workers live "
                    f"{HEALTHY_TIMEOUT_S:.0f} s after it: the next fault comes anyway")
            next_at = max(time.monotonic() + 2.0, injected + rnd.uniform(0.8, 1.2) * gap_s)
        time.sleep(max(0.0, started + duration_s - time.monotonic()))
        if mover is not None:
            mover.join(HANDOVER_JOIN_S)
    finally:
        feeder.stop()
        if mover is not None:
            report.handovers = mover.runs
    try:
        result = handle.drain(timeout=300)
        report.status = result.status
    except (JobFailedError, TimeoutError) as exc:
        report.status, report.failure = "failed", str(exc)
        say(f"== job failed: {exc}")
        say_replicas(handle, say, "not finished")
        with contextlib.suppress(JobFailedError, TimeoutError):  # (the failure is the report's)
            handle.stop()
        return report
    outputs, written = [], {}
    for r in read_topic(stack.bootstrap_servers, out_topic):
        outputs.append(json.loads(r.value))
        h = {k: v.decode() for k, v in r.headers}
        # each copy's writer output, seq and place: names a duplicated record's copies
        written.setdefault(outputs[-1]["id"], []).append(
            f"sink {':'.join(h.get('rsink', '?').split(':')[-2:])} rseq {h.get('rseq')} at [{r.partition}]@{r.offset}"
            + _written_by(h))
    letters, copies = [], {}
    for r in read_topic(stack.bootstrap_servers, f"{name}.dlq"):
        h = {k: v.decode() for k, v in r.headers}
        if h.get("job") == name and "source.topic" in h:
            letter = (h["source.topic"], int(h["source.partition"]), int(h["source.offset"]))
            letters.append(letter)
            # which output wrote each copy, under which seq, where: tells a late batch of a fenced
            # writer (the same seq twice) from replicas numbering apart (two seqs)
            copies.setdefault(letter, []).append(f"rseq {h.get('rseq')} at {r.offset}" + _written_by(h))
    report.feed_failed = feeder.failed
    report.verdict = verify(outputs, feeder.ids, letters, feeder.malformed, SOURCES, copies, written)
    compare_replicas(result, handle.plan, report.verdict)
    return report


def _written_by(headers: dict[str, str]) -> str:
    """Who wrote an output record and when, from its headers (``rwriter``, ``sink_ts``), as the
    logs show the time (UTC, milliseconds)."""
    out = f" by {headers['rwriter']}" if "rwriter" in headers else ""
    if "sink_ts" in headers:
        ts = float(headers["sink_ts"])
        out += f" {time.strftime('%H:%M:%S', time.gmtime(ts))},{int(ts * 1000) % 1000:03d}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replication soak", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return command(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=sorted(FAULTS), default="liverobin")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load and faults (default 120)")
    parser.add_argument("--seed", type=int, default=None, help="fault schedule seed (default: random, printed)")
    parser.add_argument("--rate", type=float, default=300.0, help="events/s over both topics (default 300)")
    parser.add_argument("--executors", type=int, default=5, help="executor JVMs (default 5)")
    parser.add_argument("--workers", type=int, default=4,
                        help="workers hosting the job (default 4; the other executors are spares)")
    parser.add_argument("--gap", type=float, default=12.0, help="seconds between faults (default 12)")
    parser.add_argument("--faults", metavar="KIND,...", default="",
                        help="draw only these faults (default: the whole catalogue of the mode)")
    parser.add_argument("--rhino-replicas", type=int, default=1, metavar="N",
                        help="workers holding each partition's checkpoints (spark.replication.rhino.replicas, "
                             "default 1)")
    parser.add_argument("--no-rhino", dest="rhino", action="store_false",
                        help="Rhino checkpoints off (no lost replica is restored: only faults that lose none)")
    parser.add_argument("--no-handovers", dest="handovers", action="store_false",
                        help="no vnode moves, rescales or rebalances between the faults")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")


def command(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        faults = fault_catalogue(args.mode, (f.strip() for f in args.faults.split(",") if f.strip()), args.rhino)
    except ValueError as exc:
        print(f"error: --faults: {exc}", file=sys.stderr)
        return 2
    if args.rhino_replicas < 1:
        print(f"error: --rhino-replicas: at least 1, not {args.rhino_replicas}", file=sys.stderr)
        return 2
    try:
        import kafka  # noqa: F401 - the checking reader: another client than the runtime's
    except ImportError:
        print("error: the soak reads its output with kafka-python: pip install kafka-python "
              "(./dev installs it with the development dependencies)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    report = run_soak(args.mode, args.duration, seed, args.rate, args.executors, args.workers, args.gap,
                      faults=faults, rhino_replicas=args.rhino_replicas, rhino=args.rhino, handovers=args.handovers)
    print("\n".join(report.lines()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**asdict(report), "ok": report.ok}, f, indent=1)
    return 0 if report.ok else 1
