"""The worker side of a running job: its data plane.

A worker (:mod:`.worker`) hosts partition instances (:mod:`.instance`): sources reading Kafka,
processing instances consuming their input channels in the orderer's order, each driving its
operator chain (:mod:`.operators`, :mod:`.sink`).  Output channels (:mod:`.channels`) batch and
stamp elements (:mod:`.elements`); senders (:mod:`.senders`) carry the batches to every replica;
receivers (:mod:`.intake`) drop duplicates by seq (:mod:`.dedup`).  Checkpoints
(:mod:`.checkpoints`), the exactly-once sink (:mod:`.exactly_once`) and the dead-letter topic
(:mod:`.deadletter`) are the I/O around the pure protocol packages.

Records flow one way: the driver's control plane (:mod:`replication.control`) instructs workers,
the runtime imports nothing of it, and the pure protocol packages (``merge``, ``liverobin``,
``kazoo_leader``, ``rhino_state``) and ``transport`` import nothing of the runtime.
"""
