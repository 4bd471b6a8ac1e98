"""The identifiers every package shares: a partition of a task, and a replica of one.

Plain tuples (they are dict keys everywhere and travel on the wire as they are); the names say
which is which.
"""

PartitionId = tuple[int, int]
"""(task id, partition)."""

ReplicaId = tuple[int, int, int]
"""(task id, partition, replica)."""
