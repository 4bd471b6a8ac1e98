"""Active replication for stateful stream processing on Apache Spark.

The public API: build a :class:`Job`, hand it to :func:`run`, get a :class:`JobHandle`.
"""

from replication.api import DataStream, Job, JobDefinitionError, KeyedStream
from replication.config import ConfigError, ReplicationConfig
from replication.control.handle import JobHandle, JobResult
from replication.control.launch import run
from replication.control.master import JobFailedError
from replication.functions import Aggregator, KeyedProcessFunction, ProcessContext, RuntimeContext, StateTtl

__all__ = [
    "Aggregator", "ConfigError", "DataStream", "Job", "JobDefinitionError", "JobFailedError", "JobHandle",
    "JobResult", "KeyedProcessFunction", "KeyedStream", "ProcessContext", "ReplicationConfig", "RuntimeContext",
    "StateTtl", "run",
]
