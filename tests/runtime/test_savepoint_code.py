"""A new run's processing replica from a savepoint: the functions that replaced operators at runtime
run on only from a durable resume's savepoint (``plan.savepoint_code``); from any other the job's
own do."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyspark import cloudpickle

from replication import savepoint
from replication.api import Job
from replication.config import ReplicationConfig
from replication.functions import KeyedProcessFunction
from replication.plan import plan_job
from replication.runtime.chain import chain_operators
from replication.runtime.processing import ProcessingInstance


def _tagged(value):
    return ("v1", value)


def _tagged_again(value):
    return ("v2", value)


class Count(KeyedProcessFunction):
    def __init__(self, tag: str = "v1") -> None:
        self.tag = tag

    def process(self, value, ctx):
        yield self.tag, value


def _instances(tmp_path, keeps_code: bool) -> dict[str, ProcessingInstance]:
    """The replicas of a run started from a savepoint whose run had replaced the map ``tag`` (a
    task without keyed state) and the process function ``count`` (a keyed one), built."""
    job = Job("j")
    job.source("in").rebalance().map(_tagged, name="tag").key_by(lambda v: v).process(Count(), name="count") \
        .sink("out")
    plan = plan_job(job, default_parallelism=2, num_key_groups=64, num_vnodes=8, topic_partitions={"in": 2})
    root = str(tmp_path / "sp")
    code = {"tag": {"tag": cloudpickle.dumps(_tagged_again)}, "count": {"count": cloudpickle.dumps(Count("v2"))}}
    for task in ("tag", "count"):
        for p in range(2):
            savepoint.write_replica(root, task, p, 0, {"entries": [], "operators": {}, "code": code[task]})
    savepoint.write_meta(root, job="j", num_key_groups=64, tasks={"in": 2, "tag": 2, "count": 2}, sources=[],
                         keyed=["count"], code_versions={("tag", "tag"): 1, ("count", "count"): 3})
    plan.savepoint, plan.savepoint_code = (root, savepoint.read_meta(root)), keeps_code
    worker = SimpleNamespace(cfg=ReplicationConfig(kafka_bootstrap_servers="127.0.0.1:9092"),
                             boot=SimpleNamespace(run_id="run", output_prefix="run"), job_name="j",
                             state_root=tmp_path, plan=plan, sink_producer=None)
    out = {}
    for name in ("tag", "count"):
        inst = ProcessingInstance(worker, next(t for t in plan.tasks if t.name == name), 1, 0, plan)
        inst.build([])
        out[name] = inst
    return out


@pytest.mark.parametrize("keeps_code", [True, False])
def test_a_replica_from_a_savepoint_runs_the_replaced_functions_only_from_a_durable_resume_s(tmp_path, keeps_code):
    built = _instances(tmp_path, keeps_code)
    try:
        tag = next(op for op in chain_operators(built["tag"].chain) if op.name == "tag")
        count = next(op for op in chain_operators(built["count"].chain) if op.name == "count")
        assert tag.fn("x") == (("v2", "x") if keeps_code else ("v1", "x"))
        assert count.fn.tag == ("v2" if keeps_code else "v1")
        # what it checkpoints and drains into its own savepoint: the function it runs
        assert set(built["count"].code) == ({"count"} if keeps_code else set())
        assert set(built["tag"].savepoint_content()["code"]) == ({"tag"} if keeps_code else set())
    finally:
        for inst in built.values():
            inst.close_state()
