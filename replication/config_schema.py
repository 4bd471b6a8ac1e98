"""The declarations of the ``spark.replication.*`` keys, grouped by what they configure.

Each key is a dataclass field carrying its :class:`~replication.config_keys.Key` spec (name, type,
default, bounds, the text of ``docs/configuration.md``). :class:`replication.config.ReplicationConfig`
combines the groups and owns parsing, cross-key validation and the derived client configs.
"""

from __future__ import annotations

import dataclasses

from replication.config_keys import BOOL, DURATION, ENUM, INT, STR, key_field


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicaKeys:
    """How partitions are replicated, ordered and checkpointed: replication on/off, the ordering mode
    with its LiveRobin and KaZoo keys, and Rhino's checkpoints."""

    enabled: bool = key_field(
        "enabled", BOOL, False,
        "Run every partition of every task (sources and sinks included) as two active replicas on two "
        "different executors, so that an executor failure is masked.",
    )
    mode: str = key_field(
        "mode", ENUM, "unordered",
        "How a task orders its input channels. `unordered`: first come, first served: fast, deterministic "
        "only for tasks with one input channel (with replication, a job with others is refused unless "
        "`unordered.allowDivergence`). `liverobin`: a leaderless "
        "deterministic merge driven by heartbeat pulses (paper 004, Algorithm 1): both replicas of every "
        "task consume their inputs in the same order, a replica failure causes no pause; records wait for "
        "the next pulse (about half `liverobin.heartbeatPeriod` plus a Kafka round trip). `kazoo`: per "
        "partition with several input channels or a keyed process function, a leader elected in ZooKeeper "
        "writes the consumption order, stamped with its clock (processing time), to a Kafka order log that "
        "both replicas follow (needs `zookeeper.connect`); a leader failure "
        "pauses that partition until a new leader takes over (about `kazoo.sessionTimeout`, or at once "
        "when the driver sees the executor leave).",
        choices=("unordered", "liverobin", "kazoo"),
    )
    unordered_allow_divergence: bool = key_field(
        "unordered.allowDivergence", BOOL, False,
        "With replication in `unordered` mode, run a job whose tasks have several input channels (unions, "
        "shuffles from several upstream partitions, joins) anyway: their two replicas consume the channels "
        "in different orders, so their state and output may diverge (the paper's no-ordering baseline). "
        "Without it such a job is refused before it starts, naming the tasks.",
    )
    liverobin_heartbeat_period_ms: int = key_field(
        "liverobin.heartbeatPeriod", DURATION, 10,
        "How often the heartbeat generator in the driver appends a pulse to the heartbeat log "
        "(`liverobin` mode). Shorter: lower latency, more control traffic.", min=1, max=10_000,
    )
    liverobin_max_pulse_step: int = key_field(
        "liverobin.maxPulseStep", INT, 1_000,
        "At most this many records of a source partition between two pulses (`liverobin` mode): a backlog "
        "is cut into bounded merge cycles, so no input queue has to hold more than one cycle.",
        min=1, max=10_000_000,
    )
    liverobin_heartbeat_topic: str | None = key_field(
        "liverobin.heartbeatTopic", STR, None,
        "Where the heartbeat log goes (`liverobin` mode; `kazoo`: pulse windows): each run writes topics "
        "`<this>.<run>.<n>` of one partition, a segment of 100 pulses each; unset: `_replication.<job name>.heartbeats`.",
        fmt="topic",
    )
    kazoo_session_timeout_ms: int = key_field(
        "kazoo.sessionTimeout", DURATION, 2_000,
        "ZooKeeper session timeout of each worker (`kazoo` mode): a leader whose executor hangs or loses "
        "ZooKeeper for this long is replaced (the server may round it into its own min/max, 2 to 20 ticks).",
        min=100, max=600_000,
    )
    kazoo_window_pulse_period_ms: int = key_field(
        "kazoo.windowPulsePeriod", DURATION, 30,
        "How often the driver appends a pulse to the heartbeat log while a handover holds a pulse window "
        "open (`kazoo` mode). During a window every record "
        "waits for its source partition's leader to order it, and every pulse flows through every partition: "
        "on 2 cores, 30 ms gave shorter batched rescales and a lower p99 during them than 10 or 20 ms "
        "(bench/README.md); a step's margins are counted in these pulses.",
        min=1, max=10_000,
    )
    kazoo_max_batch: int = key_field(
        "kazoo.maxBatch", INT, 1_000,
        "At most this many elements per order record (`kazoo` mode). Up to `kazoo.maxInFlight` records are "
        "in flight per partition; the next one orders everything that arrived meanwhile, up to this cap.",
        min=1, max=1_000_000,
    )
    kazoo_max_in_flight: int = key_field(
        "kazoo.maxInFlight", INT, 4,
        "Order records a leader may have written and not yet seen in the log (acknowledged in its turn, or "
        "read back), per partition (`kazoo` mode). With one, an element that arrives while an order is on its "
        "way waits for it before it is ordered; more let it go out at once, in more, smaller records (see "
        "`kazoo.pipelineBelow`). An order read back after a later one of the same leader is ignored by every "
        "replica and its elements ordered again.",
        min=1, max=1_000,
    )
    kazoo_pipeline_below: int = key_field(
        "kazoo.pipelineBelow", INT, 32,
        "While an order record is in flight, another is written only if it would name fewer than this many "
        "elements (`kazoo` mode): at a low rate records go out at once, under load the next one waits for "
        "the log and grows instead of multiplying (each record costs the broker a request).",
        min=1, max=1_000_000,
    )
    kazoo_min_batch: int = key_field(
        "kazoo.minBatch", INT, 1,
        "An order is written as soon as this many elements are unordered (`kazoo` mode), or when the "
        "oldest has waited `kazoo.idleTimeout`.", min=1, max=1_000_000,
    )
    kazoo_idle_timeout_ms: int = key_field(
        "kazoo.idleTimeout", DURATION, 2,
        "How long an unordered element may wait for `kazoo.minBatch` to fill (`kazoo` mode).", min=0, max=10_000,
    )
    rhino_enabled: bool = key_field(
        "rhino.enabled", BOOL, False,
        "Take Rhino incremental checkpoints at deterministic positions and replicate them to a replica "
        "group of other executors, so that a lost replica is restored from them; upstreams keep a backup of "
        "what a partition consumed since its last completed checkpoint. Needs mode `liverobin` or `kazoo`. "
        "Without `enabled=true` this is checkpoint-restart recovery (one instance per partition: a lost "
        "partition is rolled back to its checkpoint and replayed; the passive baseline).",
    )
    rhino_replicas: int = key_field(
        "rhino.replicas", INT, 1,
        "Executors in each partition's replica group (holders of its checkpoints, other than those "
        "running its live replicas; the worker of the replica that ships them holds them too); increments "
        "travel along them as a chain.", min=1, max=16,
    )
    rhino_checkpoint_every: int = key_field(
        "rhino.checkpointEvery", INT, 100,
        "Checkpoint every this many pulses (`liverobin` mode: a pulse is written when a source partition "
        "grew, at most one a period, and once a second while none does, so 100 at the default 10 ms "
        "period is about a checkpoint a second under steady input and one every 100 s when idle) or order "
        "records (`kazoo` mode, partitions with an order log). Both replicas checkpoint at the same "
        "position, so their digests must be equal; a mismatch is reported as a divergence.",
        min=1, max=1_000_000,
    )
    rhino_checkpoint_elements: int = key_field(
        "rhino.checkpointElements", INT, 1_000,
        "`kazoo` mode: sources and partitions with no order log (one input channel, no keyed process "
        "function) checkpoint every this many "
        "records read or elements consumed (both replicas at the same ones, so their digests compare and "
        "either may ship them); every partition also checkpoints once at its start.", min=1, max=100_000_000,
    )
    rhino_checkpoint_interval_ms: int = key_field(
        "rhino.checkpointInterval", DURATION, 1_000,
        "`kazoo` mode: besides their count-based checkpoints, sources and partitions with no order log "
        "also checkpoint before a record whose time (its Kafka timestamp at a source, its event time "
        "downstream) enters a new interval of this length, and partitions with an order log after the "
        "order record holding such a record, so that slow partitions and large orders have recent "
        "checkpoints too; both replicas meet the same records in the same order, so they checkpoint at "
        "the same ones.", min=1, max=3_600_000,
    )
    rhino_backup_limit: int = key_field(
        "rhino.backupLimit", INT, 4_096,
        "Upstream backup per output channel, in batches: what a restored replica is replayed from. "
        "Beyond it the oldest batches are dropped (and logged), which only matters when checkpoints "
        "stop completing.", min=16, max=10_000_000,
    )

@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterKeys:
    """What the job runs against: liveness timing, the Kafka brokers and ZooKeeper."""

    heartbeat_interval_ms: int = key_field(
        "heartbeatInterval", DURATION, 200, "How often workers report liveness and progress to the driver "
        "(a quiet worker, with nothing new to report and no record handled, every fifth of `failureTimeout`, at "
        "most every second).",
        min=10, max=60_000,
    )
    failure_timeout_ms: int = key_field(
        "failureTimeout", DURATION, 2_000,
        "A worker silent for this long (a hung executor) is declared dead (four times this long when more "
        "than half of the workers are silent at once; twice its longest gap between heartbeats in the last minute, "
        "up to four times this long, when its heartbeats came late lately, and four times until its first "
        "heartbeat, while it builds its replicas; ten times when its loss would end the job: it runs the last "
        "replica of a partition nothing else can restore); its replicas are cut off and fenced, and the "
        "surviving replicas carry on. An executor that exits is noticed at once.",
        min=100, max=600_000,
    )
    kafka_bootstrap_servers: str = key_field(
        "kafka.bootstrapServers", STR, None,
        "Kafka brokers for sources, sinks and internal topics, e.g. `127.0.0.1:9092`.",
        required=True, fmt="hostports",
    )
    kafka_idle_fetch_wait_ms: int = key_field(
        "kafka.idleFetchWait", DURATION, 200,
        "Fetch wait of a worker's source consumer once it found no record for "
        "`kafka.idleAfter` (0: keep the short wait). A broker that answers a waiting fetch only when its wait "
        "ends (the embedded one) is otherwise asked about a hundred times a second per consumer by a job with "
        "no input; the first records after such a pause are seen up to half this long late.",
        min=0, max=10_000,
    )
    kafka_idle_after_ms: int = key_field(
        "kafka.idleAfter", DURATION, 5_000,
        "How long a worker's source consumer finds no record before it fetches with `kafka.idleFetchWait`, "
        "and its KaZoo order-log reader reads no order (with no input waiting) before it stops fetching "
        "until input arrives.",
        min=100, max=3_600_000,
    )
    zookeeper_connect: str | None = key_field(
        "zookeeper.connect", STR, None,
        "ZooKeeper connect string for leader election and membership; unset: none.",
        fmt="zkconnect",
    )
    zookeeper_digest: str | None = key_field(
        "zookeeper.digest", STR, None,
        "`user:password`: every ZooKeeper session of the job authenticates with this digest identity, and "
        "the nodes it creates (KaZoo elections, membership) carry an ACL giving that identity alone access; "
        "unset: open ACLs.", fmt="credentials", secret=True,
    )

@dataclasses.dataclass(frozen=True, kw_only=True)
class DataflowKeys:
    """How the job's data moves and is kept: parallelism, workers, channels, keyed state, handovers,
    savepoints and restores."""

    parallelism: int = key_field(
        "parallelism", INT, 2, "Default parallelism of operators that do not set their own.", min=1, max=1024,
    )
    workers: int = key_field(
        "workers", INT, 0,
        "Number of long-running Spark tasks hosting partition instances; 0: one worker task per executor.",
        min=0, max=4096,
    )
    channel_batch_size: int = key_field(
        "channel.batchSize", INT, 256, "Elements per network batch on a channel.", min=1, max=100_000,
    )
    channel_buffer_timeout_ms: int = key_field(
        "channel.bufferTimeout", DURATION, 5, "A batch that is not full is sent after this long.", min=0, max=10_000,
    )
    channel_flush_when_idle: bool = key_field(
        "channel.flushWhenIdle", BOOL, True,
        "Send a batch that is not full as soon as its instance has no input left to process and no batch of "
        "its channel is on its way (else when that one arrives), instead of after `channel.bufferTimeout`: "
        "at low rates records do not wait for the timer (p50 at 1,000 events/s 18 -> 3 ms), at the cost of "
        "smaller batches (up to twice the CPU per event at a few thousand events/s). `false`: batches close "
        "only when full or timed out, for jobs that need throughput more than latency.",
    )
    channel_queue_capacity: int = key_field(
        "channel.queueCapacity", INT, 64,
        "Bounded input queue per partition instance, in batches; senders are back-pressured beyond it.",
        min=1, max=100_000,
    )
    state_dir: str | None = key_field(
        "state.dir", STR, None,
        "Directory for RocksDB state and checkpoints on each executor; unset: a temporary directory.",
    )
    state_key_groups: int = key_field(
        "state.keyGroups", INT, 32768,
        "Number of key groups G (key group = stable hash of the key mod G), the unit of state partitioning.",
        min=1, max=32768, pow2=True,
    )
    state_vnodes: int = key_field(
        "state.vnodes", INT, 256,
        "Number of virtual nodes (key-group ranges, the unit of migration); "
        "must be <= `state.keyGroups` and >= the largest operator parallelism.",
        min=1, max=32768,
    )
    state_cache_entries: int = key_field(
        "state.cacheEntries", INT, 10_000, "Write-back state cache size per partition instance, in entries.",
        min=1, max=10_000_000,
    )
    handover_chunk_bytes: int = key_field(
        "handover.chunkBytes", INT, 8 * 1024 * 1024,
        "A handover sends the state it moves from the origin to the target replicas in calls of about this many "
        "bytes at most (a gRPC message is limited to 64 MiB).", min=256, max=32 * 1024 * 1024,
    )
    restore_from: str | None = key_field(
        "restoreFrom", STR, None,
        "Start from the savepoint in this directory (written by `JobHandle.drain(savepoint=DIR)`): sources at its "
        "offsets, keyed tasks with its state, at whatever parallelism this run plans (docs/savepoints.md). A path "
        "every executor reads, or a URI `pyarrow.fs` opens (`s3://`, `gs://`, `hdfs://`).",
    )
    checkpoint_dir: str | None = key_field(
        "checkpointDir", STR, None,
        "Also write the job's completed consistent cuts of Rhino checkpoints to this directory: a path every "
        "executor and the driver can reach, or a URI `pyarrow.fs` opens (`s3://`, `gs://`, `hdfs://`). Each "
        "checkpoint uploads only its increment, off the instance thread; a cut is written last, checksummed. A "
        "job started again with the same name and directory resumes from the newest complete cut "
        "(docs/operations.md). Needs `rhino.enabled=true`.",
    )
    checkpoint_dir_retain: int = key_field(
        "checkpointDir.retain", INT, 3,
        "Cuts kept in `checkpointDir`; older ones, and the increments only they need, are deleted as new ones "
        "are written.", min=1, max=10_000,
    )
    checkpoint_dir_ignore: bool = key_field(
        "checkpointDir.ignore", BOOL, False,
        "Start empty although `checkpointDir` holds checkpoints of this job: they are deleted first.",
    )
    handover_max_bytes_in_flight: int = key_field(
        "handover.maxBytesInFlight", INT, 0,
        "At most this many bytes of keyed state in handovers instructed and not yet loaded, over every job and "
        "task (0: no cap). A step waits until the ones before it loaded; one larger than the cap runs alone. The "
        "state of each vnode is measured before a handover job is planned, which scans every partition's store.",
        min=0, max=1 << 50,
    )

@dataclasses.dataclass(frozen=True, kw_only=True)
class OperationKeys:
    """How the job is run and watched: dead letters, watermarks, start and stop timeouts, metrics, RPC
    TLS and the sinks' linger."""

    dead_letter_topic_name: str | None = key_field(
        "deadLetterTopic", STR, None,
        "Topic receiving malformed records with the reason; unset: `<job name>.dlq`.", fmt="topic",
    )
    watermark_interval_ms: int = key_field(
        "watermark.interval", DURATION, 200,
        "Sources emit a watermark when event time advanced by at least this much.", min=1, max=3_600_000,
    )
    stop_timeout_ms: int = key_field(
        "stopTimeout", DURATION, 10_000, "Graceful stop wait before the Spark job is cancelled.",
        min=100, max=600_000,
    )
    start_timeout_ms: int = key_field(
        "startTimeout", DURATION, 120_000, "How long the driver waits for all worker tasks to register.",
        min=1_000, max=3_600_000,
    )
    metrics_interval_ms: int = key_field(
        "metrics.interval", DURATION, 1_000, "How often workers report metrics to the driver.",
        min=10, max=3_600_000,
    )
    metrics_port: int = key_field(
        "metrics.port", INT, 0,
        "TCP port of the driver's Prometheus endpoint (`GET /metrics`, text format 0.0.4, listening on "
        "`metrics.bindAddress`); 0: no endpoint. See docs/operations.md.", min=0, max=65_535,
    )
    metrics_bind_address: str | None = key_field(
        "metrics.bindAddress", STR, None,
        "Address the Prometheus endpoint listens on; unset: the driver's (`spark.driver.bindAddress`, else "
        "`spark.driver.host`). `0.0.0.0` listens on every interface.",
    )
    metrics_basic_auth: str | None = key_field(
        "metrics.basicAuth", STR, None,
        "`user:password` that scrapers must send (HTTP basic authentication) to the Prometheus endpoint; "
        "unset: no authentication.", fmt="credentials", secret=True,
    )
    rpc_tls_enabled: bool = key_field(
        "rpc.tls.enabled", BOOL, False,
        "Mutual TLS on every gRPC channel of the job (driver, workers, checkpoint chains) with the PEM files "
        "of `rpc.tls.certChain`, `rpc.tls.privateKey` and `rpc.tls.trustCerts`, read on the driver (the "
        "workers get them with the job, as they get its RPC secret). Spark's `spark.ssl.rpc.enabled` (or `spark.ssl.enabled`) turns it on "
        "too, and then its PEM `spark.ssl.rpc.certChain` and `spark.ssl.rpc.privateKey` are used where these "
        "keys are unset. Calls are authenticated with or without it (docs/operations.md#security).",
    )
    rpc_tls_cert_chain: str | None = key_field(
        "rpc.tls.certChain", STR, None,
        "PEM certificate chain every process of the job presents (server and client side).",
    )
    rpc_tls_private_key: str | None = key_field(
        "rpc.tls.privateKey", STR, None, "PEM private key (unencrypted) of `rpc.tls.certChain`.",
    )
    rpc_tls_trust_certs: str | None = key_field(
        "rpc.tls.trustCerts", STR, None,
        "PEM certificates of the authorities peers' certificates must chain to; unset: `rpc.tls.certChain` "
        "itself (one self-signed certificate for the job).",
    )
    rpc_tls_server_name: str | None = key_field(
        "rpc.tls.serverName", STR, None,
        "Check peers' certificates against this name instead of the address dialled (one certificate for "
        "the whole cluster); unset: the address.",
    )
    sink_linger_ms: int = key_field(
        "sink.lingerMs", INT, 100,
        "Producer `linger.ms` for sinks and dead-letter writers, in milliseconds. Their records are read "
        "when their transaction commits, and the commit sends whatever is queued, so this only bounds how "
        "long records wait in the client before a commit; short values make librdkafka's broker thread "
        "wake and poll every few milliseconds while batches wait for an answer.",
        min=0, max=900_000,
    )
