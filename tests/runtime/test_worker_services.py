"""The control-plane services' contract on the worker's side (replication.runtime.services): what
each reports goes with the heartbeat, a report the driver did not get goes again, and each part
of a reply reaches its service alone."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from replication import heartbeat_parts as parts
from replication.heartbeat_parts import CutOffs, HandoverAcks, HandoverOrders, ReplicaAck
from replication.messages import Instructions
from replication.metrics import InstanceMetrics
from replication.runtime.services import WorkerServices
from tests.runtime.test_worker_unit import _link, _Replica, _Unreachable, _worker
from transport import wire


@wire.record
@dataclass(frozen=True)
class Tally:
    count: int


class Counter:
    """A service no module of the library has: reports how often it was told, keeps what it got."""

    name = "counter"

    def __init__(self) -> None:
        self.applied: list = []
        self.settled: list[bool] = []

    def report(self) -> Tally:
        return Tally(len(self.applied))

    def settle(self, part: Tally, delivered: bool) -> None:
        self.settled.append(delivered)

    def apply(self, part: Tally) -> None:
        self.applied.append(part)


class _Acking(_Replica):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.acks: list[ReplicaAck] = []
        self.orders: list = []
        self.metrics = InstanceMetrics()
        self.handovers = None

    def take_handover_acks(self) -> list[ReplicaAck]:
        acks, self.acks = self.acks, []
        return acks

    def apply_handover(self, order) -> None:
        self.orders.append(order)


def test_a_new_service_reports_with_every_beat_and_applies_only_its_part():
    worker = _worker()
    link = _link(worker)
    counter = Counter()
    worker.services.add(counter)
    driver = link.beats = _Unreachable()
    assert link.heartbeat(with_metrics=False) is None  # the driver is unreachable
    driver.fail = False
    link.heartbeat(with_metrics=False)
    assert driver.sent[0].parts["counter"] == Tally(0) and counter.settled == [False, True]
    worker._apply = lambda reply: worker.services.apply(reply.parts)
    worker._apply(Instructions("run", parts={"counter": Tally(7), parts.HANDOVERS: HandoverOrders()}))
    worker._apply(Instructions("run"))  # no part for it: not called
    assert counter.applied == [Tally(7)]


def test_acks_and_cut_offs_of_a_failed_beat_go_with_the_next_and_only_what_was_delivered_is_dropped():
    replica = _Acking(3, 1, 0, kinds=())
    worker = _worker(replica)
    link = _link(worker)
    driver = link.beats = _Unreachable()
    first = ReplicaAck(5, 1, (3, 1, 0), "armed")
    replica.acks.append(first)
    worker.cut_offs.cut_off((4, 0, 1), 2, "send failed")
    assert link.heartbeat(with_metrics=False) is None
    driver.fail = False
    second = ReplicaAck(5, 1, (3, 1, 0), "switched")
    replica.acks.append(second)
    link.heartbeat(with_metrics=False)
    sent = driver.sent[-1].parts
    assert sent[parts.HANDOVERS] == HandoverAcks([first, second])
    assert sent[parts.CUT_OFFS] == CutOffs({(4, 0, 1): (2, "send failed")})
    link.heartbeat(with_metrics=False)
    assert parts.HANDOVERS not in driver.sent[-1].parts and parts.CUT_OFFS not in driver.sent[-1].parts


def test_orders_reach_every_hosted_replica():
    a, b = _Acking(3, 0, 0), _Acking(3, 1, 1)
    worker = _worker(a, b)
    worker.checkpoints, worker.routes = None, SimpleNamespace(workers_dead=lambda dead: None,
                                                              workers_finished=lambda done: None)
    worker._start_services()
    order = {"id": 4, "epoch": 2, "task": 3, "table": {"epoch": 2, "num_vnodes": 2, "assignment": [0, 1],
                                                       "parallelism": 2},
             "moves": [(1, 1, 0)], "switch_at": 10, "release_at": 12, "upstreams": [(1, 0)],
             "committed": False, "cancelled": False}
    worker._apply(Instructions("run", parts={parts.HANDOVERS: HandoverOrders([order])}))
    assert [o.handover_id for o in a.orders] == [o.handover_id for o in b.orders] == [4]


def test_the_worker_runs_a_service_of_every_name_the_parts_define():
    names = {v for k, v in vars(parts).items() if k.isupper() and isinstance(v, str)}
    worker = _worker()
    _link(worker)
    assert set(worker.services.names()) == names - {parts.CHECKPOINTS}  # (no Rhino here)
    assert isinstance(worker.services, WorkerServices)
