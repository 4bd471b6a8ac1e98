"""KaZoo: leader-based ordering of a replicated partition's input channels (DESIGN §5, paper 004 §IV).

* :mod:`kazoo_leader.orders`: the order log record (:class:`Order`) and the applier every replica
  runs on the log's records in the log's order (:class:`OrderApplier`); pure, property-tested;
* :mod:`kazoo_leader.proposer`: the leader's proposer (:class:`OrderProposer`); pure;
* :mod:`kazoo_leader.orderer`: both fed from a partition instance's input queues and an inbox;
* :mod:`kazoo_leader.window_order`: a source partition's records and a pulse window's pulses in
  KaZoo order (both replicas put the pulses between the same records); pure;
* :mod:`kazoo_leader.segments`: a partition's order log as a sequence of short topics; pure;
* :mod:`kazoo_leader.order_log`: the Kafka edge (one reader and writer of order logs per worker);
* :mod:`kazoo_leader.election`: the ZooKeeper edge (one session per worker, epochs from
  sequential nodes, eviction of a dead worker by the driver).
"""

from kazoo_leader.orders import Order, OrderApplier, OrderLogCorrupt
from kazoo_leader.proposer import OrderProposer

__all__ = ["Order", "OrderApplier", "OrderLogCorrupt", "OrderProposer"]
