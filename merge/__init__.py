"""Input queues and the orderer interface, with the no-ordering baseline."""

from merge.orderer import ArrivalOrderer, Orderer
from merge.queues import InputQueues, QueuesClosed

__all__ = ["ArrivalOrderer", "InputQueues", "Orderer", "QueuesClosed"]
