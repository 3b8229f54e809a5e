#!/usr/bin/env python3
"""One quota stream, as an Envoy with a bucket per API key would keep it, against a running
sluice-server: N buckets of envoy/rlqs/edge.yaml's per-key rule, reported every 5 s, a fraction
BUSY of them offered their whole limit (10/s) and the rest a request in 5 s. Prints when every
bucket had its first assignment, then over 20 s of steady reports: fundings a
second (lease asks), the server's and Redis' CPU, Redis' commands a second, and the server's RSS and Redis'
memory grown per bucket; and the server's RSS once the stream has ended.

    rlqs-scale.py HOST:PORT SERVER_PID REDIS_PORT N BUSY

scripts/rlqs-scale.sh starts Redis and the server and runs it. Needs the project's .venv
(xds-protos' gRPC stubs).
"""
import queue, sys, threading, time, subprocess, urllib.request
import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from google.protobuf import duration_pb2

addr, server_pid, redis_port, n, busy_frac = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])

def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])

def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().split(")")[1].split()
    return (int(f[11]) + int(f[12])) / 100.0

def redis_info(field):
    out = subprocess.run(["redis-cli", "-p", redis_port, "INFO", "all"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith(field + ":"):
            return float(line.split(":")[1])

def redis_pid():
    return int(redis_info("process_id"))

def report(seconds, first):
    usages = []
    busy = int(n * busy_frac)
    for i in range(n):
        allowed = 1 if first else (50 if i < busy else 1)
        usages.append(rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage(
            bucket_id=rlqs_pb2.BucketId(bucket={"name": "per-key", "key": f"k{i}"}),
            time_elapsed=duration_pb2.Duration(seconds=seconds),
            num_requests_allowed=allowed, num_requests_denied=0))
    return rlqs_pb2.RateLimitQuotaUsageReports(domain="edge", bucket_quota_usages=usages)

channel = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)])
stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel)
reports = queue.Queue()
assigned = set()
def read(responses):
    try:
        for r in responses:
            for a in r.bucket_action:
                assigned.add(a.bucket_id.bucket["key"])
    except grpc.RpcError:
        pass  # the stream ended: this script closed it
rss0 = rss_kb(server_pid)
mem0 = redis_info("used_memory")
responses = stub.StreamRateLimitQuotas(iter(reports.get, None))
threading.Thread(target=read, args=(responses,), daemon=True).start()
t0 = time.time()
reports.put(report(0, True))
while len(assigned) < n and time.time() - t0 < 30:
    time.sleep(0.05)
print(f"{len(assigned)} of {n} assigned {time.time()-t0:.2f} s after the first report")
# Steady: a report every 5 s; measure CPU over 20 s after 6 s of settling.
rp = redis_pid()
next_report = t0 + 5
def pump(until):
    global next_report
    while time.time() < until:
        if time.time() >= next_report:
            reports.put(report(5, False)); next_report += 5
        time.sleep(0.05)
pump(t0 + 6)
def commandstats():
    """Each command's (calls, usec) so far; a script's usec includes its commands'."""
    out = subprocess.run(["redis-cli", "-p", redis_port, "INFO", "commandstats"], capture_output=True, text=True).stdout
    stats = {}
    for line in out.splitlines():
        if line.startswith("cmdstat_"):
            name, fields = line[len("cmdstat_"):].split(":", 1)
            f = dict(kv.split("=") for kv in fields.split(","))
            stats[name] = (int(f["calls"]), int(f["usec"]))
    return stats
def fundings():
    """Lease asks the server has made (every funding is one)."""
    with urllib.request.urlopen(f"http://{addr}/metrics") as r:
        lines = r.read().decode().splitlines()
    return sum(float(l.split()[-1]) for l in lines if l.startswith("sluice_lease_answers_total"))
h0 = fundings()
s0 = commandstats()
c0s, c0r, cmd0, w0 = cpu_s(server_pid), cpu_s(rp), redis_info("total_commands_processed"), time.time()
pump(w0 + 20)
w = time.time() - w0
print(f"fundings {(fundings()-h0)/w:,.0f}/s")
print(f"server CPU {(cpu_s(server_pid)-c0s)/w:.3f} core, Redis CPU {(cpu_s(rp)-c0r)/w:.3f} core, Redis {(redis_info('total_commands_processed')-cmd0)/w:,.0f} commands/s")
s1 = commandstats()
for name, (c, u) in sorted(s1.items(), key=lambda kv: -kv[1][1]):
    dc, du = c - s0.get(name, (0, 0))[0], u - s0.get(name, (0, 0))[1]
    if dc:
        print(f"  {name:<10} {dc / w:>9,.0f} calls/s {du / dc:>8.2f} us a call")
print(f"server RSS +{(rss_kb(server_pid)-rss0)*1024/n:,.0f} B a bucket; Redis +{(redis_info('used_memory')-mem0)/n:,.0f} B a bucket")
reports.put(None)
channel.close()
time.sleep(3)
print(f"server RSS {rss_kb(server_pid) / 1024:.1f} MB 3 s after the stream ended (was {rss0 / 1024:.1f} MB before it began)")
