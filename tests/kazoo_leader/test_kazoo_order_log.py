"""The KaZoo order log's Kafka edge (kazoo_leader.order_log) on the real embedded broker: two
workers writing one segmented log at once, every record written past a full segment is written
again, and both readers hand out the same log, every order once, at contiguous positions, whether
a record came to them read or (their own) acknowledged."""

from __future__ import annotations

import threading
import time

from confluent_kafka.admin import AdminClient

from kazoo_leader.order_log import OrderLog
from kazoo_leader.orders import Order
from kazoo_leader.segments import SegmentedLog
from transport.kafka_io import ensure_topics


def test_two_writers_of_one_segmented_log_are_read_alike_and_nothing_is_lost(stack, topic_prefix):
    log_ = SegmentedLog(topic_prefix + "orders", per_segment=5)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    ensure_topics(admin, {log_.topic(n): 1 for n in range(3)})
    read: dict[int, list[Order]] = {0: [], 1: []}
    errors: list[str] = []
    lock = threading.Lock()
    logs, publish = [], []
    for w in (0, 1):
        def got(orders, w=w):
            with lock:
                read[w].extend(orders)

        order_log = OrderLog({"bootstrap.servers": stack.bootstrap_servers, "group.id": f"orders-{w}"},
                             {"bootstrap.servers": stack.bootstrap_servers},
                             lambda topics: ensure_topics(admin, dict.fromkeys(topics, 1)), name=f"w{w}")
        publish.append(order_log.register(log_, 0, got, lambda order, reason: errors.append(reason), errors.append))
        order_log.start()
        logs.append(order_log)
    try:
        # bursts from both writers into the segment their readers are in: some land past its end
        sent = []
        for burst in range(6):
            for w in (0, 1):
                for i in range(4):
                    order = Order(w + 1, burst * 4 + i, ((w, 1),))
                    publish[w](order)
                    sent.append(order)
            time.sleep(0.3)
        deadline = time.monotonic() + 30
        while min(len(read[0]), len(read[1])) < len(sent):
            assert time.monotonic() < deadline, f"read {len(read[0])} and {len(read[1])} of {len(sent)} orders"
            time.sleep(0.05)
        time.sleep(0.5)  # nothing more comes: every order is in the log once
        for w in (0, 1):
            assert sorted((o.epoch, o.seq) for o in read[w]) == sorted((o.epoch, o.seq) for o in sent)
            assert [o.offset for o in read[w]] == list(range(len(sent)))
        assert [(o.epoch, o.seq) for o in read[0]] == [(o.epoch, o.seq) for o in read[1]]
        assert sum(order_log.rewritten for order_log in logs) > 0  # bursts of 8 into segments of 5
        # every order written was handed out, however it came (read, acknowledged in turn, or with a
        # segment completed): nothing keeps the readers from resting
        assert [order_log.awaiting for order_log in logs] == [0, 0]
        assert not errors
    finally:
        for order_log in logs:
            order_log.close()
