"""KaZoo: leader-based ordering of a replicated partition's input channels (DESIGN §5, paper 004 §IV).

So far the pure part (:mod:`kazoo_leader.orders`): the order log record (:class:`Order`), the
applier every replica runs on what it reads back from the log (:class:`OrderApplier`) and the
leader's proposer (:class:`OrderProposer`).  ZooKeeper election and the Kafka order topic are
the rest of the KaZoo issue.
"""

from kazoo_leader.orders import Order, OrderApplier, OrderLogCorrupt, OrderProposer

__all__ = ["Order", "OrderApplier", "OrderLogCorrupt", "OrderProposer"]
