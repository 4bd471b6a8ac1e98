"""The job master's decisions without Spark: heartbeats in, instructions out (replication.control)."""

from __future__ import annotations

import time

from kazoo_leader.segments import SEGMENT_ORDERS, SegmentedLog
from replication.config import ReplicationConfig
from replication.control.liveness import WorkerInfo
from replication.control.master import JobMaster
from replication.control.order_retention import OrderLogRetention, order_log_needed_from
from replication.control.retention import log_needed_from
from replication.control.status_view import job_status
from replication.durability import WINDOW_STRIDE, ResumePoint, run_lineage
from replication.examples.ordered import build_ordered_job
from replication.heartbeat_parts import CutOffs, DrainPositions, OutputProgress
from replication.messages import (
    Ack,
    Attach,
    Heartbeat,
    Instructions,
    Register,
    Restored,
    RestoreReplica,
    WorkerFinished,
)
from replication.metrics import InstanceMetrics
from replication.plan import place, plan_job
from rhino_state.durable import DurableCut
from rhino_state.manager import CompletedCheckpoint, RestorePlan
from tests.ordered_runs import wait_until


def _master(mode: str = "kazoo", rhino: bool = False, workers: int = 3) -> JobMaster:
    """The ordered job (two sources of two partitions, union, keyed chain, sink) replicated on
    ``workers`` registered workers."""
    job = build_ordered_job("a", "b", "out", name="jm")
    plan = plan_job(job, default_parallelism=2, num_key_groups=64, num_vnodes=8, topic_partitions={"a": 2, "b": 2})
    plan.replicas = 2
    conf = {"spark.replication.kafka.bootstrapServers": "127.0.0.1:1", "spark.replication.enabled": "true",
            "spark.replication.mode": mode, "spark.replication.rhino.enabled": str(rhino).lower()}
    if mode == "kazoo":
        conf["spark.replication.zookeeper.connect"] = "127.0.0.1:2181"
    master = JobMaster(plan, place(plan, workers), workers, ReplicationConfig.from_mapping(conf), "", "app-1")
    master.workers = {w: WorkerInfo(w, 0, str(w), f"127.0.0.1:{4000 + w}", last_seen=time.monotonic(), heard=True)
                      for w in range(workers)}
    master.started_at = time.monotonic()
    return master


def _replicas(master: JobMaster, task: str) -> list[tuple[int, int, int]]:
    tid = next(t.id for t in master.plan.tasks if t.name == task)
    return sorted(r for r in master.placement if r[0] == tid)


def _beat(master: JobMaster, w: int, unchanged: bool = False, metrics: dict | None = None, **parts) -> Instructions:
    """A heartbeat of worker ``w`` with the services' ``parts`` (by service name)."""
    return master.heartbeat(Heartbeat(worker=w, attempt=0, metrics=metrics, unchanged=unchanged, parts=parts))


def _said(reply: Instructions, service: str) -> dict:
    """What ``reply`` tells of ``service``: its part's one field (empty when it has none)."""
    part = reply.parts.get(service)
    return {} if part is None else next(iter(vars(part).values()))


# -- quiet workers hear of a change at once ---------------------------------------------------

def test_a_quiet_worker_is_rung_when_its_reply_would_change_and_every_worker_for_a_command():
    """Quiet workers beat seldom (replication.runtime.driver_link): the driver tells which are from
    their beats (nothing new, the same reply twice) and rings those whose reply would now differ,
    so they ask for it at once; a worker that is not quiet beats at its interval anyway and is not
    rung; a command set from outside a heartbeat rings every worker."""
    master = _master(workers=3)
    bells = {w: master.bells.attach((w, 0)) for w in range(3)}

    def rung() -> dict[int, int]:
        return {w: bell.wait_past(-1, 0) for w, bell in bells.items()}

    for w in (0, 1):
        _beat(master, w)
        _beat(master, w, unchanged=True)  # the same reply twice, nothing new: quiet
    _beat(master, 2, unchanged=False)
    assert rung() == {0: 0, 1: 0, 2: 0}
    master.measurements.request(3)  # the reply changes (set directly: the JobHandle's request rings by itself)
    _beat(master, 2)
    assert rung() == {0: 1, 1: 1, 2: 0}  # the quiet ones, once
    _beat(master, 2)
    assert rung() == {0: 1, 1: 1, 2: 0}
    _beat(master, 0, unchanged=True)  # a new reply: not quiet yet
    _beat(master, 0, unchanged=True)  # quiet again
    master.measurements.request(3)
    _beat(master, 1)
    assert rung() == {0: 2, 1: 1, 2: 0}  # worker 1 was rung before and has not been quiet since
    master.set_command("drain")
    assert rung() == {0: 3, 1: 2, 2: 1}


# -- a drain without pulses ends both replicas of a source at the same offsets ------------------

def test_a_drain_ends_every_replica_of_a_source_where_the_furthest_reported():
    master = _master()
    source = _replicas(master, "source-a")
    t, p0, _ = source[0]
    assert source[0][:2] == source[1][:2]
    w0, w1 = master.placement[source[0]], master.placement[source[1]]
    reply = _beat(master, w0, drains=DrainPositions({source[0]: {0: 120}}))
    assert (t, p0) not in _said(reply, "drains")  # the other replica has not said where it is
    reply = _beat(master, w1, drains=DrainPositions({source[1]: {0: 135}}))
    assert _said(reply, "drains")[(t, p0)] == {0: 135}  # both read to 135: the same records on both
    assert _said(_beat(master, w0), "drains")[(t, p0)] == {0: 135}  # and it stays


def test_a_replica_that_dies_before_it_reported_leaves_the_decision_to_the_live_one():
    master = _master(rhino=True, workers=4)
    source = _replicas(master, "source-b")[:2]
    w0, w1 = (master.placement[r] for r in source)
    _beat(master, w0, drains=DrainPositions({source[0]: {1: 40, 0: -1}}))
    with master.locked():
        master.declare_dead(w1, "killed")
    assert master.drains.ends[source[0][:2]] == {0: -1, 1: 40}


# -- a replica an upstream cut off by itself is replaced, never silently dropped -----------------

def test_a_cut_off_replica_is_stopped_where_it_runs_and_shown_lost():
    master = _master(mode="liverobin")
    victim = _replicas(master, "chain")[0]
    upstream_worker = master.placement[_replicas(master, "union-2")[0]]
    reply = _beat(master, upstream_worker,
                  cut_offs=CutOffs({victim: (master.placement[victim], "channel 4: 1025 batches behind the other replica")}))
    assert victim in master.lost and _said(reply, "cut_offs") == {victim: 0}
    assert any("replaced: an upstream cut it off" in text and "1025 batches behind" in text
               for _, text in master.events)
    assert job_status(master, "running")["lost"] == [master.replica_label(*victim)]


def test_a_cut_off_reported_for_a_replica_that_moved_since_is_ignored():
    master = _master(mode="liverobin")
    victim = _replicas(master, "chain")[0]
    elsewhere = next(w for w in master.workers if w != master.placement[victim])
    _beat(master, elsewhere, cut_offs=CutOffs({victim: (elsewhere, "send failed")}))  # not where it runs
    assert victim not in master.lost and not master.losses.dropped


def test_a_cut_off_of_a_replica_whose_worker_finished_is_ignored_and_its_upstreams_are_rung():
    """A worker that finished stops its server: an upstream whose last (duplicate) batches were
    still on their way fails to send them.  The replica has everything (END came from the other
    upstream replica): nothing is lost, and the job does not fail on it."""
    master = _master(mode="liverobin")
    victim = _replicas(master, "chain")[1]
    w = master.placement[victim]
    upstream = next(x for x in master.workers if x != w)
    bell = master.attach(Attach(upstream, 0)).bell
    master.finished(WorkerFinished(w, 0, "finished"))
    assert bell.wait_past(0, timeout=0) >= 1  # the upstream's next heartbeat (retire) goes now
    _beat(master, upstream, cut_offs=CutOffs({victim: (w, "channel 4: send failed: CANCELLED")}))
    assert victim not in master.lost and not master.losses.dropped and master.failure is None


def test_losing_a_sink_writer_passes_both_its_writer_roles_to_the_twin():
    master = _master(mode="liverobin")
    sink = _replicas(master, "chain-sink")[0]
    t, p, r = sink
    assert master.sinks[(t, p, "out")][:2] == [r, 0] and master.sinks[(t, p, "dlq")][:2] == [r, 0]
    with master.locked():
        master.declare_dead(master.placement[sink], "killed")
    assert master.sinks[(t, p, "out")][:2] == [1 - r, 1] and master.sinks[(t, p, "dlq")][:2] == [1 - r, 1]


def test_a_writer_fenced_at_its_current_epoch_is_named_again_with_a_higher_one():
    """A superseded takeover's producer (a replica declared dead while it initialised, woken up
    later) fenced the writer named after it: that writer says so and is named again, so it
    fences the stray producer in turn.  A writer fenced because a newer one took over is not."""
    master = _master(mode="liverobin")
    t, p, r = _replicas(master, "chain-sink")[0]
    writer_worker = master.placement[(t, p, r)]
    reply = _beat(master, writer_worker, outputs=OutputProgress(fenced={(t, p, r, "out"): 0}))
    assert master.sinks[(t, p, "out")][:2] == [r, 1] and _said(reply, "outputs")[(t, p, "out")][:2] == (r, 1)
    assert master.sinks[(t, p, "dlq")][:2] == [r, 0]  # the other output of the partition is untouched
    assert any("was fenced as writer at epoch 0: it takes over again (epoch 1)" in text for _, text in master.events)
    _beat(master, writer_worker, outputs=OutputProgress(fenced={(t, p, r, "out"): 0}))  # the same report again, before the role arrived
    assert master.sinks[(t, p, "out")][:2] == [r, 1]
    twin_worker = master.placement[(t, p, 1 - r)]
    _beat(master, twin_worker, outputs=OutputProgress(fenced={(t, p, 1 - r, "out"): 1}))  # not the writer: rightly fenced
    assert master.sinks[(t, p, "out")][:2] == [r, 1]


# -- when nothing is left to restore from, the job fails at once, saying what was lost ----------

def test_losing_both_replicas_and_every_holder_of_the_checkpoint_fails_the_job_at_once():
    """Every partition has a completed checkpoint on its group member.  The holder of chain[0]'s
    dies, then the workers of its two replicas: nothing is left to roll it back from, and the job
    fails at once, naming what was lost (before, it waited for a holder that could never come
    back: a relaunched worker holds none of the old checkpoints)."""
    master = _master(mode="liverobin", rhino=True, workers=3)
    rhino = master.rhino
    for inst in rhino.instances():
        rhino.checkpoint_completed(inst, 7, {}, holders=rhino.groups[inst])
    chain = _replicas(master, "chain")[:2]
    holder = rhino.groups[chain[0][:2]][0]
    with master.locked():
        master.declare_dead(holder, "killed")
        assert master.failure is None  # one loss per partition: every one of them is masked
        for replica in chain:
            master.declare_dead(master.placement[replica], "killed")
    assert master.failure is not None and master.command == "stop"
    assert "both replicas of" in master.failure and "every worker holding the checkpoint 7" in master.failure


def test_an_evicted_worker_s_last_report_does_not_replace_a_restored_replica_s_figures():
    """chain[0]r0 ran on a worker declared dead and was restored elsewhere, where it finished with
    its state's digest; the evicted attempt's Finished report comes later, with its never-finished
    copy of the replica: the driver keeps the restored replica's figures."""
    master = _master(mode="liverobin", workers=3)
    replica = _replicas(master, "chain")[0]
    label = master.replica_label(*replica)
    old_worker = master.placement[replica]
    with master.locked():
        master.declare_dead(old_worker, "killed")
    restored = InstanceMetrics(finished=True, state_digest="ab" * 32)
    other = next(w for w in master.workers if w != old_worker)
    _beat(master, other, metrics={label: restored})
    master.finished(WorkerFinished(old_worker, 0, "evicted", metrics={label: InstanceMetrics()}))
    assert master.snapshot()[label].state_digest == "ab" * 32


# -- a relaunched worker declared dead in turn is stopped, so Spark relaunches it again ----------

def test_a_relaunched_worker_declared_dead_again_is_evicted_when_it_is_heard_from():
    """Worker 1 is relaunched (a standby that hosts restored replicas and holds checkpoints), then
    paused past the failure timeout: declared dead, its replicas restored elsewhere.  When it wakes
    up it must be told to stop (Spark then runs it again as a fresh standby); left running, it
    stayed dead to the driver for good and its groups lost a member for the rest of the run."""
    master = _master(mode="kazoo", rhino=True, workers=4)
    master.worker_attempts.start_timeout_s = 1.0
    with master.locked():
        master.declare_dead(1, "killed")
    registered = master.register(Register(1, 1, "9", "127.0.0.1:4901", 4242))
    assert registered.status == "standby" and 1 not in master.dead
    assert master.heartbeat(Heartbeat(worker=1, attempt=1)).command != "evicted"
    with master.locked():
        master.declare_dead(1, "silent for 2.0s")
    assert master.heartbeat(Heartbeat(worker=1, attempt=1)).command == "evicted"


def test_a_worker_relaunched_after_its_attempt_reported_its_end_registers_as_a_standby():
    """An attempt that reported its end is not declared dead when Spark runs the worker again
    (a report is final); the new attempt still registers, as a standby, instead of failing the
    registration on a death that was never recorded."""
    master = _master(mode="liverobin", rhino=True, workers=4)
    master.worker_attempts.start_timeout_s = 1.0
    master.finished(WorkerFinished(1, 0, "finished"))
    assert 1 not in master.dead
    assert master.register(Register(1, 1, "9", "127.0.0.1:4901", 4242)).status == "standby"
    assert 1 not in master.dead and master.failure is None


# -- how far back the LiveRobin heartbeat log is read ---------------------------------------------

def _report_pulses(master: JobMaster, pulses: dict[tuple[int, int, int], int]) -> None:
    by_worker: dict[int, dict[str, InstanceMetrics]] = {}
    for replica, pulse in pulses.items():
        by_worker.setdefault(master.placement[replica], {})[master.replica_label(*replica)] = \
            InstanceMetrics(pulse=pulse)
    for w, metrics in by_worker.items():
        _beat(master, w, metrics=metrics)


def test_the_heartbeat_log_is_read_from_the_lowest_pulse_a_live_source_replica_counted():
    master = _master(mode="liverobin", rhino=False, workers=3)
    sources = _replicas(master, "source-a") + _replicas(master, "source-b")
    assert log_needed_from(master) is None  # no source replica reported yet
    pulses = {r: 500 + 10 * i for i, r in enumerate(sources)}
    _report_pulses(master, {r: h for r, h in pulses.items() if r != sources[3]})
    assert log_needed_from(master) is None  # one has not
    _report_pulses(master, {sources[3]: 420})
    assert log_needed_from(master) == 420
    with master.locked():  # its worker dies: nobody restores it (no Rhino), nobody reads for it
        master.declare_dead(master.placement[sources[3]], "killed")
    alive = [r for r in sources if master.placement[r] not in master.dead]
    assert log_needed_from(master) == min(pulses[r] for r in alive)
    master.metrics[master.replica_label(*alive[0])] = InstanceMetrics(pulse=100, finished=True)
    assert log_needed_from(master) == min(pulses[r] for r in alive[1:])  # (a drained one reads no more)


def _report_order_logs(master: JobMaster, at: dict[tuple[int, int, int], int]) -> None:
    for replica, position in at.items():
        _beat(master, master.placement[replica], metrics={master.replica_label(*replica): InstanceMetrics(
            order_log_at=position)})


def test_a_kazoo_order_log_is_kept_from_where_its_slowest_live_replica_reads():
    master = _master(mode="kazoo", rhino=False, workers=3)
    r0, r1 = _replicas(master, "chain")[:2]
    inst = r0[:2]
    assert order_log_needed_from(master, inst) is None  # no replica reported yet
    _report_order_logs(master, {r0: 2500})
    assert order_log_needed_from(master, inst) is None  # one has not
    _report_order_logs(master, {r1: 1500})
    assert order_log_needed_from(master, inst) == 1500
    with master.locked():  # its worker dies: nobody restores it (no Rhino), nobody reads for it
        master.declare_dead(master.placement[r1], "killed")
    assert order_log_needed_from(master, inst) == 2500


def test_with_rhino_a_kazoo_order_log_is_kept_from_the_oldest_checkpoint_a_restore_may_use():
    """A restore reads the order log on from its checkpoint's ``order_from``: the log is kept from
    the lowest of the checkpoints the driver keeps, and whole while none completed yet or one does
    not say (an earlier build's)."""
    master = _master(mode="kazoo", rhino=True, workers=4)
    rhino = master.rhino
    r0, r1 = _replicas(master, "chain")[:2]
    inst = r0[:2]
    _report_order_logs(master, {r0: 5000, r1: 5200})
    assert order_log_needed_from(master, inst) is None  # no checkpoint completed yet
    rhino.checkpoint_completed(inst, 40, {}, holders=rhino.groups[inst], order_from=1200)
    assert order_log_needed_from(master, inst) == 1200
    rhino.checkpoint_completed(inst, 80, {}, holders=rhino.groups[inst], order_from=3400)
    assert order_log_needed_from(master, inst) == min(cp.order_from for cp in rhino.kept(inst))
    with master.locked():  # lost: restored from a checkpoint the driver keeps, not from where it was
        master.declare_dead(master.placement[r0], "killed")
    assert order_log_needed_from(master, inst) == min(cp.order_from for cp in rhino.kept(inst))
    rhino.checkpoint_completed(inst, 120, {}, holders=rhino.groups[inst])  # (no order_from: kept whole)
    assert order_log_needed_from(master, inst) is None


def test_a_resumed_run_numbers_its_pulse_windows_above_those_of_the_runs_before():
    """Its restored sources handled windows of the run before (whose pulses are in the heartbeat
    log it goes on in): a window numbered among those would never be held for."""
    master = _master(mode="kazoo")
    assert master.windows.next_window() == (1, 0)
    cut = DurableCut(3, "jm", {}, run={"output_prefix": "p", "epoch_base": 0, "window_base": WINDOW_STRIDE})
    master.windows.base = run_lineage(ResumePoint("dir", cut), "run-2")["window_base"]
    assert master.windows.next_window() == (2 * WINDOW_STRIDE + 1, None)  # (which of those had pulses: not said)
    assert run_lineage(None, "run-1")["window_base"] == 0


def test_the_order_logs_lose_only_the_segments_below_the_one_still_read_less_a_margin():
    needed: dict[tuple[int, int], int | None] = {(2, 0): None, (2, 1): 2 * SEGMENT_ORDERS + 5}
    deleted: list[str] = []
    logs = {inst: SegmentedLog(f"o.t{inst[0]}p{inst[1]}") for inst in needed}
    retention = OrderLogRetention(_master(), logs, deleted.extend, needed_from=lambda master, inst: needed[inst])
    retention.round()
    assert deleted == []  # (2, 1) is read from segment 2: nothing below it beyond the margin
    needed.update({(2, 0): 4 * SEGMENT_ORDERS, (2, 1): 5 * SEGMENT_ORDERS - 1})
    retention.round()
    assert deleted == ["o.t2p0.0", "o.t2p0.1", "o.t2p1.0", "o.t2p1.1"]
    retention.round()
    assert len(deleted) == 4 == retention.deleted  # each once


def test_with_rhino_the_heartbeat_log_is_kept_from_the_oldest_source_checkpoint_a_restore_may_use():
    """A source checkpoint's id is the last pulse it placed; a restore from it reads the log from
    there, so the log is kept from the oldest source checkpoint Rhino still keeps."""
    master = _master(mode="liverobin", rhino=True, workers=4)
    rhino = master.rhino
    sources = _replicas(master, "source-a") + _replicas(master, "source-b")
    _report_pulses(master, {r: 800 for r in sources})
    assert log_needed_from(master) is None  # no checkpoint of the sources yet
    for inst in rhino.instances():
        rhino.checkpoint_completed(inst, 300, {}, holders=rhino.groups[inst])
    assert log_needed_from(master) == 300
    for inst in rhino.instances():
        rhino.checkpoint_completed(inst, 600, {}, holders=rhino.groups[inst])
    kept = min(rhino.retain_from(inst) for inst in rhino.instances() if inst[0] == sources[0][0])
    assert log_needed_from(master) == kept and kept in (300, 600)
    _report_pulses(master, {sources[0]: 250})  # a replica far behind its twin
    assert log_needed_from(master) == 250
    with master.locked():  # lost: restored from a checkpoint Rhino keeps, not from where it was
        master.declare_dead(master.placement[sources[0]], "killed")
    assert log_needed_from(master) == min(rhino.retain_from(inst) for inst in rhino.instances()
                                                     if inst[0] == sources[0][0])


def test_without_rhino_a_relaunched_worker_stays_a_bystander_and_is_not_evicted():
    master = _master(mode="liverobin", rhino=False, workers=3)
    master.worker_attempts.start_timeout_s = 1.0
    with master.locked():
        master.declare_dead(2, "killed")
    assert master.register(Register(2, 1, "9", "127.0.0.1:4902", 4242)).status == "standby"
    assert master.heartbeat(Heartbeat(worker=2, attempt=1)).command != "evicted"


# -- a worker whose process exits is dead at once ---------------------------------------------

def test_a_worker_whose_watch_ends_before_its_report_is_declared_dead_at_once():
    """The watch of an attempt ends when its process exits: dead now, not after failureTimeout of
    silence.  Ignored for an attempt that reported its end first, or one Spark replaced since."""
    master = _master(mode="liverobin", rhino=True, workers=4)
    master.worker_attempts.start_timeout_s = 1.0
    watches = {w: master.attach(Attach(w, 0)) for w in range(4)}
    end_of = {w: watched.on_end for w, watched in watches.items()}
    end_of[0]()
    assert "its process exited" in master.dead[0]
    assert all(r in master.lost for r, w in master.placement.items() if w == 0)
    # the others are rung: their writer roles changed, they must not wait for their next heartbeat
    assert all(watches[w].bell.wait_past(0, timeout=0) >= 1 for w in (1, 2, 3))
    master.finished(WorkerFinished(1, 0, "finished"))
    end_of[1]()
    assert 1 not in master.dead
    with master.locked():
        master.declare_dead(2, "killed")
    assert master.register(Register(2, 1, "9", "127.0.0.1:4902", 4242)).status == "standby"
    end_of[2]()  # the attempt Spark relaunched
    assert 2 not in master.dead
    master.attach(Attach(2, 1)).on_end()
    assert "its process exited" in master.dead[2]
    master.end_watching()  # the job is over: the driver's server stops next, ending every watch
    end_of[3]()
    assert 3 not in master.dead


# -- a restored replica is caught up once it is where its twin was ------------------------------

class _RestoringPeer:
    def __init__(self, checkpoint_id: int) -> None:
        self.checkpoint_id = checkpoint_id

    def call(self, method: str, request: object, reply_type: type, timeout: float) -> object:
        assert method == "Restore"
        return Restored(self.checkpoint_id, {}, 0.01, 0.02, pulse=0)


def test_in_kazoo_a_restored_replica_catches_up_at_the_checkpoint_its_twin_had_taken():
    """KaZoo has no pulses to compare: the replica restored from checkpoint 100 is caught up once
    it took the checkpoint its twin had taken at the restore (250), not at once."""
    master = _master(mode="kazoo", rhino=True, workers=4)
    replica = _replicas(master, "chain")[0]
    t, p, r = replica
    twin = master.replica_label(t, p, 1 - r)
    label = master.replica_label(*replica)
    master.metrics[twin] = InstanceMetrics(checkpoint_id=250)
    host = next(w for w in master.workers if w not in master.rhino.replica_workers((t, p)))
    address = master.workers[host].address
    master.restores.peers[address] = _RestoringPeer(100)
    with master.locked():
        master.lost[replica] = time.time()
    master.restores.restore(replica, host, address, RestoreReplica(replica, 100, {}, {}, {}, 1),
                    RestorePlan(host, CompletedCheckpoint(100, {}, frozenset({host})), rollback=False))
    assert replica in master.restores.catching_up
    with master.locked():
        master.metrics[label] = InstanceMetrics(restored_from=100, checkpoint_id=200)
        master.restores.check_caught_up()
        assert replica in master.restores.catching_up
        master.metrics[label] = InstanceMetrics(restored_from=100, checkpoint_id=250)
        master.restores.check_caught_up()
        assert replica not in master.restores.catching_up and master.recoveries[-1]["replica"] == label


def test_a_restored_replica_is_not_caught_up_by_the_figures_of_its_lost_incarnation():
    """The lost replica last reported pulse 3032 (it had been restored once before); restored from
    checkpoint 2900 it is caught up only once it reports its twin's pulse itself."""
    master = _master(mode="liverobin", rhino=True, workers=4)
    replica = _replicas(master, "chain")[0]
    t, p, r = replica
    twin = master.replica_label(t, p, 1 - r)
    label = master.replica_label(*replica)
    master.metrics[twin] = InstanceMetrics(pulse=3032)
    master.metrics[label] = InstanceMetrics(pulse=3032, restored_from=2300, checkpoint_id=3000)
    host = next(w for w in master.workers if w not in master.rhino.replica_workers((t, p)))
    address = master.workers[host].address
    master.restores.peers[address] = _RestoringPeer(2900)
    with master.locked():
        master.lost[replica] = time.time()
    master.restores.restore(replica, host, address, RestoreReplica(replica, 2900, {}, {}, {}, 1),
                    RestorePlan(host, CompletedCheckpoint(2900, {}, frozenset({host})), rollback=False))
    with master.locked():
        master.restores.check_caught_up()  # what any heartbeat does
        assert replica in master.restores.catching_up
        master.metrics[label] = InstanceMetrics(pulse=2950, restored_from=2900)
        master.restores.check_caught_up()
        assert replica in master.restores.catching_up
        master.metrics[label] = InstanceMetrics(pulse=3032, restored_from=2900)
        master.restores.check_caught_up()
        assert replica not in master.restores.catching_up and master.recoveries[-1]["replica"] == label



class _HostDiesDuringTheRestore:
    """The host completes the restore, but is declared dead before its reply is handled (a worker
    starved by its restores, the soak: 'worker 0 was declared dead while it was unresponsive')."""

    def __init__(self, master: JobMaster, host: int) -> None:
        self.master, self.host = master, host

    def call(self, method: str, request: RestoreReplica, reply_type: type, timeout: float) -> object:
        with self.master.locked():
            self.master.declare_dead(self.host, "silent for 2.1s")
        return Restored(request.checkpoint_id, {}, 0.01, 0.02, pulse=0)


def test_a_replica_restored_on_a_worker_declared_dead_meanwhile_is_lost_again_not_placed_there():
    """Placed on the dead worker, it was taken for live: nothing restored it again, its partition
    ran on one replica for good, and the soak saw it 'catching up' until its timeout."""
    master = _master(mode="liverobin", rhino=True, workers=4)
    master.worker_attempts.start_timeout_s = 1.0
    rhino = master.rhino
    for inst in rhino.instances():
        rhino.checkpoint_completed(inst, 7, {}, holders=rhino.groups[inst])
    replica = _replicas(master, "chain")[0]
    t, p, r = replica
    host = next(w for w in master.workers if w not in rhino.replica_workers((t, p)) and w != master.placement[replica])
    address = master.workers[host].address
    master.restores.peers[address] = _HostDiesDuringTheRestore(master, host)
    with master.locked():
        master.lost[replica] = time.time()
    master.restores.restore(replica, host, address, RestoreReplica(replica, 7, {}, {}, {}, 1),
                    RestorePlan(host, CompletedCheckpoint(7, {}, frozenset({host})), rollback=False))
    with master.locked():
        assert replica in master.lost and replica not in master.restores.catching_up
        assert master.placement[replica] != host and replica not in master.moves
        assert any("declared dead meanwhile" in text and master.replica_label(*replica) in text
                   for _, text in master.events)


class _RecordingRestores:
    """Every worker's peer: records the restores asked of it and completes them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, RestoreReplica]] = []

    def install(self, master: JobMaster, *more: str) -> None:
        """Be the peer of every registered worker of ``master`` (and of addresses ``more``)."""
        for address in [info.address for info in master.workers.values()] + list(more):
            master.restores.peers[address] = self.peer(address)

    def peer(self, address: str) -> object:
        recorder = self

        class _Peer:
            def call(self, method: str, request: RestoreReplica, reply_type: type, timeout: float) -> object:
                assert method == "Restore"
                recorder.calls.append((address, request))
                return Restored(request.checkpoint_id, {}, 0.01, 0.02, pulse=0)
        return _Peer()


def test_a_replica_waiting_for_a_free_worker_is_restored_when_a_relaunched_one_registers():
    """Three workers: chain[0]r0's worker dies and it is restored on the group member, the only
    holder of its checkpoint; then chain[0]r1's worker dies, leaving no free worker.  The moment
    that worker is relaunched and registers, chain[0]r1 is restored there, pulling the checkpoint
    from its holder (not at a later liveness round, by when a checkpoint may have reached it)."""
    master = _master(mode="liverobin", rhino=True, workers=3)
    master.worker_attempts.start_timeout_s = 1.0
    rhino = master.rhino
    for inst in rhino.instances():
        rhino.checkpoint_completed(inst, 7, {}, holders=rhino.groups[inst])
    first, second = _replicas(master, "chain")[:2]
    inst = first[:2]
    holder = rhino.groups[inst][0]
    restores = _RecordingRestores()
    relaunched = "127.0.0.1:4999"
    restores.install(master, relaunched)
    with master.locked():
        master.declare_dead(master.placement[first], "killed")
    deadline = time.monotonic() + 5
    while first not in master.moves:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert master.moves[first][0] == holder
    killed = master.placement[second]
    with master.locked():
        master.declare_dead(killed, "killed")
        assert second in master.lost and second not in master.restores.restoring  # no free worker to run it
    assert master.register(Register(killed, 1, "9", relaunched, 4242)).status == "standby"
    assert second in master.restores.restoring
    while second not in master.moves:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    address, req = next((a, r) for a, r in restores.calls if r.replica == second)
    assert address == relaunched and req.checkpoint_id == 7 and req.source == master.workers[holder].address


def test_a_lost_replica_is_not_restored_on_a_worker_that_reported_its_end():
    """A drain: one worker finished, then another was declared dead.  Restoring its replicas on
    the finished one (its server stopped) failed and was tried again until the drain timed out."""
    master = _master(mode="liverobin", rhino=True, workers=4)
    rhino = master.rhino
    for inst in rhino.instances():
        rhino.checkpoint_completed(inst, 7, {}, holders=range(4))
    replica = _replicas(master, "chain")[0]
    busy = rhino.replica_workers(replica[:2])
    finished, free = sorted(w for w in range(4) if w not in busy)
    restores = _RecordingRestores()
    restores.install(master)
    master.finished(WorkerFinished(finished, 0, "finished"))
    with master.locked():
        master.declare_dead(master.placement[replica], "silent for 2.1s")
    wait_until(lambda: replica in master.moves, 5, "the restore", poll_s=0.01)
    assert master.moves[replica][0] == free
    assert restores.calls and all(address != master.workers[finished].address for address, _ in restores.calls)


def test_a_resumed_run_restores_a_partition_it_lost_whole_from_the_durable_cut():
    """Right after a resume no worker holds a checkpoint of the new run yet: losing both replicas
    of a partition neither ends the job nor waits; a free worker builds it from the cut's file."""
    from rhino_state.durable import CutPart, DurableCut

    master = _master(mode="liverobin", rhino=True, workers=4)
    rhino = master.rhino
    parts = {inst: CutPart(30 + inst[0], f"file-{inst[0]}-{inst[1]}", "d", {0: 5}, {1: 6}) for inst in rhino.instances()}
    master.resume_restore_points(DurableCut(7, "jm", parts))
    first, second = [r for r in _replicas(master, "chain") if r[1] == 0]
    killed = {master.placement[first], master.placement[second]}
    assert not any(master.losses.ends_the_job(w) for w in killed)
    restores = _RecordingRestores()
    restores.install(master)
    with master.locked():
        for w in sorted(killed):
            master.declare_dead(w, "killed")
    assert master.failure is None
    wait_until(lambda: first in master.moves or second in master.moves, 5, "the rollback", poll_s=0.01)
    req = next(r for _, r in restores.calls if r.replica[:2] == first[:2])
    inst = first[:2]
    assert req.durable_file == f"file-{inst[0]}-{inst[1]}" and req.checkpoint_id == parts[inst].checkpoint_id
    assert any("built from the durable cut" in text for _, text in master.events)


class _CopyingPeer:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.calls = fail, []

    def call(self, method: str, request: object, reply_type: type, timeout: float) -> object:
        assert method == "CopyCheckpoint"
        self.calls.append(request)
        if self.fail:
            raise RuntimeError("holder unreachable")
        return Ack()


def test_a_restore_point_beside_a_replica_is_copied_to_a_member_and_a_failed_copy_is_retried():
    master = _master(mode="liverobin", rhino=True, workers=4)
    rhino = master.rhino
    replica = _replicas(master, "chain")[0]
    inst = replica[:2]
    holder = rhino.groups[inst][0]
    for i in rhino.instances():
        rhino.checkpoint_completed(i, 1, {})
    with master.locked():
        rhino.replica_moved(replica, holder)  # as if restored on its only holder
    member = rhino.groups[inst][0]
    address = master.workers[member].address
    master.restores.peers[address] = failing = _CopyingPeer(fail=True)
    with master.locked():
        master.restores.start_copies()
    deadline = time.monotonic() + 5
    while not failing.calls or master.restores.copying.get(inst, 0) > time.monotonic() + 60:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert failing.calls[0].instance == inst and failing.calls[0].source == master.workers[holder].address
    with master.locked():
        assert not rhino.survives_a_loss(inst) and master.restores.copying[inst] > time.monotonic()  # waits to retry
        master.restores.copying[inst] = 0.0
        master.restores.peers[address] = working = _CopyingPeer()
        master.restores.start_copies()
    while inst in master.restores.copying:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert working.calls and rhino.survives_a_loss(inst) and member in rhino.restore_point(inst).holders


def test_a_jobs_summary_says_how_many_records_came_too_late_for_their_window():
    from replication import JobResult

    on_time = JobResult("finished", InstanceMetrics(), {}, duration_s=3.0, records_read=1200, records_written=900)
    assert on_time.summary() == "finished after 3.0s: 1,200 records read, 900 written, 0 dead-lettered"
    late = JobResult("finished", InstanceMetrics(late_records=12), {}, duration_s=3.0, records_read=1200)
    assert late.summary().endswith(", 12 late (behind the watermark: dropped)")
