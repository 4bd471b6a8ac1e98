"""Where the driver's CPU goes while a job has no input: py-spy of the driver's own process.

For each mode, the ordered two-source job at parallelism 2 with no input: after 10 s idle, this
process's cores over 20 s (the driver runs here), then 20 s of py-spy samples (``--format raw``,
``<out>/<mode>.txt``); prints the samples by thread entry and by innermost frame.

    python bench/driver_profile.py OUT off,liverobin,kazoo
"""
import collections
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
from bench.ordering import latency_configs  # noqa: E402
from deploy.stack import EmbeddedStack  # noqa: E402
from deploy.topics import create_topics  # noqa: E402
from replication import run  # noqa: E402
from replication.examples.ordered import build_ordered_job  # noqa: E402
from replication.spark_cluster import build_session, stop_session  # noqa: E402

PY_SPY = Path(sys.executable).with_name("py-spy")


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
spark = build_session("local-cluster[3,1,512]", app_name="driver-idle")
try:
    for config in latency_configs(sys.argv[2].split(","), [10]):
        with EmbeddedStack() as stack:
            stamp = f"{int(time.time() * 1000) % 10**10}"
            a, b, o = f"idle{stamp}-a", f"idle{stamp}-b", f"idle{stamp}-out"
            create_topics(stack.bootstrap_servers, {a: 2, b: 2})
            handle = run(build_ordered_job(a, b, o, name=f"idle-{config.mode}-{stamp}", parallelism=2),
                         spark=spark, conf=config.conf(stack))
            handle.wait_started(120)
            time.sleep(10)
            c0, t0 = _own_cpu(), time.monotonic()
            time.sleep(20)
            c1, t1 = _own_cpu(), time.monotonic()
            raw = out / f"{config.mode}.txt"
            subprocess.run([str(PY_SPY), "record", "--pid", str(os.getpid()), "--duration", "20", "--rate", "100",
                            "--nonblocking", "--format", "raw", "-o", str(raw)], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            handle.stop(60)
            stacks = collections.Counter()
            for line in raw.read_text().splitlines():
                stack_text, _, n = line.rpartition(" ")
                stacks[stack_text] += int(n)
            total = sum(stacks.values())
            print(f"== {config.label}: driver process {(c1 - c0) / (t1 - t0):.3f} cores; {total} samples", flush=True)
            threads = collections.Counter()
            leaf = collections.Counter()
            for s, n in stacks.items():
                frames = s.split(";")
                threads[frames[0]] += n
                leaf[frames[-1]] += n
            for name, n in threads.most_common(8):
                print(f"   thread {n:5d} {name[:150]}")
            for name, n in leaf.most_common(15):
                print(f"   leaf   {n:5d} {name[:150]}")
            # the frame below the thread's entry that names what the thread does
            mid = collections.Counter()
            for s, n in stacks.items():
                frames = s.split(";")
                mid[";".join(f.split(" (")[0] for f in frames[1:5])] += n
            for name, n in mid.most_common(12):
                print(f"   path   {n:5d} {name[:220]}")
finally:
    stop_session(spark)
