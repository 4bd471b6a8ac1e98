"""The fraud job as a spark-submit script.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master local-cluster[3,1,512] \\
        --conf spark.executor.memory=512m \\
        --conf spark.replication.kafka.bootstrapServers=127.0.0.1:9092 \\
        replication/examples/submit_fraud.py --prefix demo- [--drain-after 30]

Without ``--drain-after`` it runs until SIGINT/SIGTERM, then stops gracefully.
"""

from __future__ import annotations

import argparse

from replication import run
from replication.examples.fraud import Topics, build_job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", default="", help="topic name prefix")
    parser.add_argument("--name", default="fraud-monitor")
    parser.add_argument("--drain-after", type=float, default=0.0, metavar="S")
    args = parser.parse_args()
    handle = run(build_job(Topics.with_prefix(args.prefix), name=args.name))
    print(handle.plan.describe(), flush=True)
    print(f"job {args.name} {handle.serve(args.drain_after).summary()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
