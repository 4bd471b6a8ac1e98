"""A worker's handling of the driver's word, without Spark (replication.runtime.worker and the
parts it is built of: driver_link, feeds, cut_exchange)."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest

from replication.handover_orders import HandoverOrder
from replication.heartbeat_parts import (
    CHECKPOINTS,
    STATE_MEASUREMENT,
    CheckpointCompleted,
    CheckpointReport,
    Drops,
    MeasureRequests,
)
from replication.messages import CutRequest, Instructions
from replication.metrics import InstanceMetrics
from replication.plan import ChannelSpec
from replication.runtime import worker as worker_module
from replication.runtime.channels import OutputChannel
from replication.runtime.checkpoints import WorkerCheckpoints
from replication.runtime.cut_exchange import CutExchange
from replication.runtime.cut_offs import CutOffReports
from replication.runtime.driver_link import RESTORED_REPORT_S, DriverLink, Mailbox
from replication.runtime.feeds import WorkerFeeds
from replication.runtime.handover_cuts import TargetCut
from replication.runtime.handovers import PartitionHandovers
from replication.runtime.output_writers import give_roles
from replication.runtime.routes import KnownMove, Routes
from replication.runtime.source_drain import drain_position
from replication.runtime.worker import Worker
from rhino_state import RoutingTable, VnodeMove
from transport import wire
from transport.frames import TransportFailure
from transport.security import RpcSecurity


class _Replica:
    def __init__(self, task: int, partition: int, replica: int, attempt: int = 0, kinds=("dlq",)) -> None:
        self.task = SimpleNamespace(id=task, is_source=False)
        self.partition, self.replica, self.attempt = partition, replica, attempt
        self.name = f"t{task}[{partition}]r{replica}"
        self.stopped = False
        self.writers = [SimpleNamespace(kind=k) for k in kinds]
        self.pending_control = None
        self.roles_given = None
        self.woken = 0
        self.error = None

    def wake(self) -> None:
        self.woken += 1

    def take_handover_acks(self) -> list:
        return []

    def request_stop(self) -> None:
        self.stopped = True


def _worker(*replicas: _Replica) -> Worker:
    worker = Worker.__new__(Worker)
    worker.instances = {(r.task.id, r.partition): r for r in replicas}
    return worker


def _routes(plan: object, index: int = 1, placement: dict | None = None, cut_off=None) -> Routes:
    """Routes of worker ``index`` whose channels batch 4 elements, keep a backup (Rhino) and
    report cut-offs to ``cut_off``."""
    cfg = SimpleNamespace(channel_batch_size=4, channel_buffer_timeout_ms=1, rhino_enabled=True,
                          rhino_backup_limit=1000)
    return Routes(index, cfg, plan, placement or {}, peer=None, deliver_local=None,
                  cut_off=cut_off or (lambda *args: None), stopping=threading.Event())


def _link(worker: Worker, heartbeat_log: object = None, **cfg: object) -> DriverLink:
    """The driver link of ``worker`` (index 1, attempt 0, no server; no checkpoints unless it has)."""
    worker.index, worker.attempt, worker.server = 1, 0, None
    worker.checkpoints = getattr(worker, "checkpoints", None)
    worker._start_services()
    worker.stopping = threading.Event()
    worker.cfg = SimpleNamespace(**{"pulse_period_ms": 0, "heartbeat_interval_ms": 1000, "metrics_interval_ms": 1000,
                                    "failure_timeout_ms": 2000, "mode": "liverobin", **cfg})
    worker.plan = SimpleNamespace(heartbeat_log=heartbeat_log)
    return DriverLink(worker)


def test_a_replica_the_driver_replaces_is_stopped_unless_it_is_a_later_incarnation():
    old, later, other = _Replica(3, 0, 1), _Replica(3, 1, 0, attempt=2), _Replica(4, 0, 0)
    worker = _worker(old, later, other)
    CutOffReports(worker).apply(Drops({(3, 0, 1): 0, (3, 1, 0): 1, (4, 0, 1): 0}))  # (4, 0, 1) does not run here
    assert old.stopped and (3, 0) not in worker.instances  # pushes to it are refused from now on
    assert not later.stopped and not other.stopped  # restored after the decision / another replica


def test_writer_roles_reach_each_output_by_kind():
    sink_partition = _Replica(4, 1, 0, kinds=("dlq", "out"))
    source = _Replica(0, 0, 1)
    roles = {(4, 1, "out"): (1, 2, 10, 20), (4, 1, "dlq"): (0, 1, 3, 4), (0, 0, "dlq"): (1, 0, -1, -1)}
    give_roles(roles, sink_partition)
    give_roles(roles, source)
    assert sink_partition.pending_control == {"out": (1, 2, 10, 20), "dlq": (0, 1, 3, 4)}
    assert source.pending_control == {"dlq": (1, 0, -1, -1)}
    assert sink_partition.woken == source.woken == 1  # each looks at its new roles at once, not at its next input
    sink_partition.pending_control = None  # taken by its loop
    give_roles(dict(roles), sink_partition)  # the next heartbeat reply repeats them
    assert sink_partition.pending_control is None and sink_partition.woken == 1
    give_roles({**roles, (4, 1, "out"): (1, 2, 11, 22)}, sink_partition)  # the writer committed more
    assert sink_partition.pending_control == {"out": (1, 2, 11, 22), "dlq": (0, 1, 3, 4)}
    assert sink_partition.woken == 2


def test_the_heartbeat_mailbox_hands_over_the_newest_reply_and_says_since_when_the_driver_is_unreachable():
    box = Mailbox()
    assert box.take(0.01) == (None, False, None)
    box.post(Instructions("run"), False, 1.0)
    box.post(Instructions("drain"), True, 2.0)  # a newer view replaces the one not applied yet
    reply, done, unreachable = box.take(0.01)
    assert reply.command == "drain" and done and unreachable is None
    box.post(None, False, 5.0)
    box.post(None, False, 6.0)
    assert box.take(0.01) == (None, True, 5.0)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(box.take(5.0)))
    waiter.start()
    time.sleep(0.05)
    box.post(Instructions("stop"), False, 7.0)  # wakes the main loop at once
    waiter.join(2)
    assert got and got[0][0].command == "stop" and got[0][2] is None


class _Unreachable:
    def __init__(self) -> None:
        self.fail = True
        self.sent: list = []

    def beat(self, req, timeout):
        if self.fail:
            raise TransportFailure("Heartbeat to 127.0.0.1:1: connection refused")
        self.sent.append(req)
        return Instructions("run")


def test_checkpoint_reports_of_a_failed_heartbeat_go_with_the_next_one():
    """The driver unpins a restored replica's checkpoint and records completions only from these
    reports: one lost with a failed heartbeat would leave the partition unrestorable until the
    next checkpoint."""
    worker = _worker()
    worker.checkpoints = WorkerCheckpoints.__new__(WorkerCheckpoints)
    worker.checkpoints._lock, worker.checkpoints._taken, worker.checkpoints._completed = threading.Lock(), [], []
    worker.checkpoints._uploaded = [(2, 0, 3500, "000000003500-ab")]  # durable checkpoints: uploads too
    worker.checkpoints._taken.append((2, 0, 0, 3500, "d1"))
    done = CheckpointCompleted(2, 0, 3500, {4: 10}, "d1", ["w1"], {5: 7}, order_from=12)
    worker.checkpoints._completed.append(done)
    link = _link(worker)
    master = link.beats = _Unreachable()
    assert link.heartbeat(with_metrics=False) is None
    worker.checkpoints._taken.append((2, 0, 0, 3550, "d2"))
    master.fail = False
    assert link.heartbeat(with_metrics=False).command == "run"
    assert master.sent[0].parts[CHECKPOINTS] == CheckpointReport(
        taken=[(2, 0, 0, 3500, "d1"), (2, 0, 0, 3550, "d2")],
        completed=[done], durable=[(2, 0, 3500, "000000003500-ab")])


def test_a_replica_restored_here_reports_its_progress_with_every_heartbeat_for_a_while():
    """The driver counts a restored replica caught up from its metrics: sent with every heartbeat
    after its restore (not every metrics interval), the catch-up shows within a heartbeat."""
    restored, other = _Replica(2, 0, 1, kinds=()), _Replica(3, 1, 0, kinds=())
    restored.metrics, other.metrics = InstanceMetrics(records_in=1), InstanceMetrics(records_in=2)
    worker = _worker(restored, other)
    worker.checkpoints = None
    link = _link(worker)
    master = link.beats = _Unreachable()
    master.fail = False
    link.heartbeat(with_metrics=False)
    link.restored((2, 0))
    link.heartbeat(with_metrics=False)
    link.heartbeat(with_metrics=True)
    link._restored_at[(2, 0)] = time.monotonic() - RESTORED_REPORT_S - 1
    link.heartbeat(with_metrics=False)
    assert [beat.metrics for beat in master.sent] == [
        None, {"t2[0]r1": restored.metrics}, {"t2[0]r1": restored.metrics, "t3[1]r0": other.metrics}, None]


def test_a_drain_without_pulses_ends_where_a_fetch_said_or_past_it():
    assert drain_position({0: 7}, {0: 5, 1: 40}) == {0: 7, 1: 40}  # read past the end fetched: its own offset
    assert drain_position({}, {0: 0}) == {0: 0}  # an empty partition: nothing to read there


# -- a replica restored here sends to destinations restored elsewhere before it existed -------------

def test_a_restored_upstream_sends_to_where_its_destinations_were_restored_meanwhile():
    """chain[0]r1 is restored here from a checkpoint at output seq 100; its channel was built from
    the placement of when its restore started, which still had the sink's replica 0 on the dead
    worker 1, but this worker had already learned that it runs on worker 3 now (needing seqs from
    40 on).  The new channel sends there, from the oldest seq it holds (the other upstream replica
    replays 40..99); it used to cut the replica off as unreachable, and when the other upstream
    replica died too the sink replica waited for those seqs for good."""
    spec = ChannelSpec(id=8, edge_id=0, src_task=3, src_partition=0, dst_task=4, dst_partition=0)
    reached: list[int] = []
    ch = OutputChannel(spec, [lambda payload: None, lambda payload: None], batch_size=4, buffer_timeout_s=0.001,
                       first_seq=100, retain=True, destinations=[1, 2])
    routes = _routes(SimpleNamespace(replicas=2))
    routes._moves_known = {(4, 0, 0): KnownMove(3, {8: 40}, restore=5)}
    routes.sender = lambda w: (reached.append(w), lambda payload: None)[1]
    routes.send_to_moved(SimpleNamespace(outputs=[ch]), restores_seen=4)
    assert ch.destination(0) == 3 and ch.destination(1) == 2 and reached == [3]
    assert ch.live_replicas == [0, 1] and routes._transports_to == {3: [(ch, 0)]}
    ch.abort()


def test_a_restored_upstream_sends_to_no_lost_replica_until_it_runs_again_even_where_it_ran():
    """union[1]r1 is restored on worker 1, relaunched under the index of the worker that ran
    chain[0]r1, which is lost and not restored yet (the placement still names worker 1).  Its
    channel to chain[0] sends nothing to replica 1 and reports no cut-off (it used to push there at
    once, be refused, and have the driver replace chain[0]r1 right after its restore on worker 1).
    Once chain[0]r1 is restored here by a restore later than the request, it replays to it; an
    older move of a replica lost since is not followed."""
    spec = ChannelSpec(id=6, edge_id=0, src_task=2, src_partition=1, dst_task=3, dst_partition=0)
    reported: list = []
    local: list[bytes] = []
    routes = _routes(SimpleNamespace(replicas=2, output_channels=lambda task, part, edge: [spec]),
                     cut_off=lambda *args: reported.append(args))
    routes.sender = lambda w: local.append if w == 1 else (lambda payload: None)
    upstream = SimpleNamespace(task=SimpleNamespace(id=2, outputs=[SimpleNamespace(edge_id=0)]), partition=1)
    placement = {(3, 0, 0): 2, (3, 0, 1): 1}
    [(_, [ch])] = routes.outputs(upstream, placement, {6: 10}, lost=frozenset({(3, 0, 1)}))
    assert ch.live_replicas == [0] and not reported
    routes._moves_known = {(3, 0, 1): KnownMove(1, {6: 10}, restore=7)}
    routes.send_to_moved(SimpleNamespace(outputs=[ch]), restores_seen=7)  # known to the driver's request
    assert ch.live_replicas == [0]
    routes._moves_known = {(3, 0, 1): KnownMove(1, {6: 10}, restore=8)}
    routes.send_to_moved(SimpleNamespace(outputs=[ch]), restores_seen=7)
    assert ch.live_replicas == [0, 1] and ch.destination(1) == 1
    ch.emit(("k", 1))
    assert ch.close(timeout=5)
    assert local and not reported


def test_a_standby_s_zookeeper_session_is_opened_once_whoever_asks_first(monkeypatch):
    """A KaZoo standby opens its session ahead of restores, in the background; a restore asking
    meanwhile gets that same session, and a session that could not start is tried again."""
    import replication.runtime.feeds as feeds_module

    clients: list = []

    class _Client:
        def __init__(self, *args, **kwargs) -> None:
            self.started = False
            clients.append(self)

        def start(self, timeout_s: float) -> None:
            time.sleep(0.2)
            if len(clients) == 1 and fail_first:
                raise RuntimeError("ZooKeeper is down")
            self.started = True

    monkeypatch.setattr(feeds_module, "ElectionClient", _Client)
    for fail_first in (False, True):
        clients.clear()
        cfg = SimpleNamespace(zookeeper_connect="zk:2181", kazoo_session_timeout_ms=2000, start_timeout_ms=1000,
                              zookeeper_digest=None, kafka_admin_config=dict)
        feeds = WorkerFeeds(SimpleNamespace(cfg=cfg, plan=None, job_name="j", election_root="/replication/j/r",
                                            epoch_base=0), 1, 0)
        feeds.start()  # the standby is ready: a session opened from now on starts at once
        opener = threading.Thread(target=feeds.open_election)
        opener.start()
        time.sleep(0.05)
        got = feeds.election()  # a restore, while the standby's own opening is under way
        opener.join(5)
        assert got.started and feeds.election() is got
        assert len(clients) == (2 if fail_first else 1)


def test_the_position_stream_is_opened_again_when_it_ended():
    class Call:
        def __init__(self, messages):
            self.messages, self.ended = messages, False

    class Master:
        def __init__(self):
            self.calls: list[Call] = []

        def stream(self, method, messages):
            assert method == "SourcePositions"
            self.calls.append(Call(messages))
            return self.calls[-1]

    link = _link(_worker(), heartbeat_log="heartbeats")
    link.report_position("t", 0, 0, 3)
    master = Master()
    link.stream_positions(master)
    link.stream_positions(master)  # open: nothing to do
    assert len(master.calls) == 1 and next(master.calls[0].messages).positions == [("t", 0, 0, 3)]
    master.calls[0].ended = True
    link.stream_positions(master)
    assert len(master.calls) == 2
    first = next(master.calls[1].messages)
    assert (first.worker, first.positions) == (1, [("t", 0, 0, 3)])  # everything known, again
    link.worker.stopping.set()
    master.calls[1].ended = True
    link.stream_positions(master)  # stopping: not again
    assert len(master.calls) == 2
    # KaZoo: a window starts where the replicas held (reported with their heartbeats): no stream
    kazoo = _link(_worker(), heartbeat_log="heartbeats", mode="kazoo")
    kazoo.report_position("t", 0, 0, 3)
    kazoo.stream_positions(master)
    assert len(master.calls) == 2


def test_a_ring_of_the_driver_sends_the_next_heartbeat_at_once():
    """A writer role passed to this worker, or a replica restored elsewhere, reaches it at once
    when the driver rings its watch, not a heartbeat interval later."""
    link = _link(_worker(), heartbeat_interval_ms=60_000, metrics_interval_ms=60_000)
    beats = threading.Semaphore(0)
    link.heartbeat = lambda with_metrics: beats.release()
    link.start(master=None)
    try:
        assert beats.acquire(timeout=30)  # the first beat
        for _ in range(2):
            link.ring()
            assert beats.acquire(timeout=30)  # not 60 s later
    finally:
        link.stop()


class _Driver:
    """The driver's end of the heartbeat port: answers ``reply`` and counts the beats."""

    def __init__(self) -> None:
        self.reply = Instructions("run")
        self.sent: list = []

    def beat(self, req, timeout):
        self.sent.append(req)
        return self.reply


def test_a_worker_is_quiet_once_a_beat_brought_nothing_new_either_way():
    """Quiet: the report (metrics apart), the records its replicas handled and the driver's reply
    all as at the beat before; anything new, or a command other than run, ends it."""
    replica = _Replica(2, 0, 1, kinds=())
    replica.metrics = InstanceMetrics()
    worker = _worker(replica)
    worker.checkpoints = None
    link = _link(worker)
    driver = link.beats = _Driver()
    link.heartbeat(with_metrics=False)
    assert not link.quiet  # nothing to compare with
    link.heartbeat(with_metrics=True)
    assert link.quiet  # the metrics do not count
    assert [beat.unchanged for beat in driver.sent] == [False, True]  # what the driver decides it from
    replica.metrics.records_out += 1
    link.heartbeat(with_metrics=False)
    assert not link.quiet
    link.heartbeat(with_metrics=False)
    assert link.quiet
    replica.error = "boom"  # news for the driver
    link.heartbeat(with_metrics=False)
    assert not link.quiet
    replica.error = None
    link.heartbeat(with_metrics=False)
    link.heartbeat(with_metrics=False)
    assert link.quiet
    driver.reply = Instructions("run", dead=[3])  # news from the driver
    link.heartbeat(with_metrics=False)
    assert not link.quiet
    link.heartbeat(with_metrics=False)
    assert link.quiet
    driver.reply = Instructions("drain")
    for _ in range(3):
        link.heartbeat(with_metrics=False)
        assert not link.quiet


def test_a_quiet_worker_beats_at_a_fifth_of_the_failure_timeout_up_to_a_second():
    """Under a quarter of the silence timeout, so the driver never counts a quiet gap late; at most
    a second, so what the driver does not ring for reaches the worker within it; never more often
    than the heartbeat interval."""
    link = _link(_worker(), heartbeat_interval_ms=200, failure_timeout_ms=2_000)
    assert link.beat_gap() == 0.2
    link.quiet = True
    assert link.beat_gap() == pytest.approx(0.4)
    link.cfg.failure_timeout_ms = 60_000
    assert link.beat_gap() == 1.0
    link.cfg.failure_timeout_ms, link.cfg.heartbeat_interval_ms = 500, 200
    assert link.beat_gap() == 0.2


def test_a_finished_worker_s_replicas_are_retired_before_pushes_give_up_on_it():
    """A push to a worker that finished gives up once the worker is known finished; by then its
    replicas must be retired (delivered), or the give-up cuts them off and fails the channel."""
    worker = _worker()
    worker.checkpoints, worker.routes = None, _routes(SimpleNamespace(replicas=2))
    worker._start_services()
    seen: list[bool] = []

    class Channel:
        def retire(self, replica: int, worker: int) -> None:
            seen.append(worker in routes.finished_workers)

    routes = worker.routes
    routes._transports_to = {2: [(Channel(), 1)]}
    worker._apply(Instructions("run", finished=[2]))
    assert seen == [False] and routes.finished_workers == {2}


def test_a_request_to_measure_state_wakes_the_replica_once():
    """An idle replica's loop sleeps up to a second; the driver's request to measure its state
    per vnode (before planning a handover) wakes it, and a repeated request does not again."""
    replica, other = _Replica(3, 0, 1, kinds=()), _Replica(4, 0, 1, kinds=())
    replica.measure_request = other.measure_request = 0
    worker = _worker(replica, other)
    worker.checkpoints, worker.routes = None, _routes(SimpleNamespace(replicas=2))
    worker._start_services()
    request = {STATE_MEASUREMENT: MeasureRequests({3: 7})}
    worker._apply(Instructions("run", parts=request))
    worker._apply(Instructions("run", parts=request))
    assert (replica.measure_request, replica.woken) == (7, 1)
    assert (other.measure_request, other.woken) == (0, 0)


def test_a_worker_whose_rpc_server_cannot_start_stops_its_data_port(monkeypatch):
    started: list = []
    real = worker_module.FrameServer

    def frame_server(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]

    def no_rpc_server(*_args, **_kwargs):
        raise OSError("address in use")

    monkeypatch.setattr(worker_module, "FrameServer", frame_server)
    monkeypatch.setattr(worker_module.rpc, "serve", no_rpc_server)
    worker = Worker.__new__(Worker)
    worker.index, worker.checkpoints = 0, None
    worker.cuts = SimpleNamespace(receive_chunk=lambda req: None, serve_kept_cut=lambda req: None)
    worker.security = RpcSecurity(b"worker-unit-secret-0123456789abcdef")
    worker.boot = SimpleNamespace(master_address="127.0.0.1:1", placement={0: "e0"})
    try:
        worker.run()
    except OSError:
        pass
    else:
        raise AssertionError("run() went on without its RPC server")
    assert len(started) == 1
    try:
        with socket.create_connection(("127.0.0.1", started[0].port), timeout=2):
            connected = True
    except OSError:
        connected = False
    assert not connected, "the data port still accepts connections"


def test_a_cut_for_a_target_replica_no_longer_here_does_not_fail_the_origin(caplog):
    worker = Worker.__new__(Worker)
    worker.index, worker.checkpoints, worker.instances = 0, None, {}
    worker._ready = threading.Event()
    worker._ready.set()
    worker.cfg = SimpleNamespace(start_timeout_ms=1000)
    worker.plan = SimpleNamespace(replicas=2, task=lambda _t: SimpleNamespace(name="chain"))
    # the target's replica 0 is placed here, but was lost (its instance is gone); replica 1's worker is dead
    worker.routes = _routes(worker.plan, index=0,
                            placement={(3, 2, 0): 0, (3, 2, 1): 1, (3, 0, 0): 0, (3, 0, 1): 1})
    worker.routes.dead_workers = {1}
    order = SimpleNamespace(handover_id=7, task=3)
    cut = TargetCut(chunks=[[(b"k", b"v")]], extras={}, digest="d", entries=1)
    assert CutExchange(worker).send(order, 2, {0: cut}) == 0
    assert "state for chain[0] not delivered here: worker 0 hosts no replica of (3, 0)" in caplog.text


def test_a_cut_no_origin_replica_keeps_is_served_by_the_twin_of_the_asking_target():
    twin = _Replica(3, 1, 1)
    twin.handovers = PartitionHandovers(3, 1, 64, 8, keep_cuts=True)
    table = RoutingTable.uniform(8, 2).moved((0,), 1)
    twin.handovers.arm(HandoverOrder(7, table.epoch, 3, table, (VnodeMove(0, 0, 1),), 10, 14, frozenset(), True))
    entries = [(0, b"a", b"1"), (1, b"b", b"2")]
    twin.handovers.state_arrived(7, 0, entries)
    worker = _worker(twin)
    worker.index, worker.plan, worker.cfg = 0, None, SimpleNamespace(handover_chunk_bytes=1 << 20)
    cuts = CutExchange(worker)
    reply = cuts.serve_kept_cut(CutRequest(7, 3, 0, 1, 0))  # origin 0 runs nowhere here; target 1's twin does
    assert not reply.missing and reply.chunks == 1 and wire.unpack_rows(reply.entries) == entries
    assert cuts.serve_kept_cut(CutRequest(8, 3, 0, 1, 0)).missing  # another handover: not received


def test_a_target_waiting_at_its_release_pulse_for_a_cut_fetches_it_in_the_background_once():
    """Each round of the worker's main loop looks for target replicas waiting too long at their
    release pulse; one already fetching is not given a second fetch."""
    from replication.runtime.cut_exchange import CUT_OVERDUE_S

    waiting = SimpleNamespace(name="chain[1]r0", handovers=SimpleNamespace(missing_cuts=lambda blocked_for: [(7, 0)]))
    fine = SimpleNamespace(name="chain[0]r0", handovers=SimpleNamespace(missing_cuts=lambda blocked_for: []))
    worker = _worker()
    worker.instances = {(3, 1): waiting, (3, 0): fine, (2, 0): SimpleNamespace(name="source[0]r0", handovers=None)}
    worker.index, worker.plan, worker.cfg = 0, None, None
    cuts = CutExchange(worker)
    started, release = threading.Semaphore(0), threading.Event()
    fetched: list = []
    cuts._fetch_cuts = lambda inst, blocked_for: (fetched.append((inst.name, blocked_for)), started.release(),
                                                  release.wait(10))
    cuts.fetch_overdue_cuts()
    assert started.acquire(timeout=10)
    cuts.fetch_overdue_cuts()  # still fetching
    release.set()
    assert not started.acquire(timeout=0.2)
    assert fetched == [("chain[1]r0", CUT_OVERDUE_S)]
