#!/usr/bin/env python3
"""Quota streams, as Envoys with a bucket per API key would keep them, against a running
sluice-server: STREAMS streams of N buckets each (distinct keys), of envoy/rlqs/edge.yaml's
per-key rule (10/s, burst 20), reported every 5 s; a fraction BUSY of each stream's buckets
offered their whole limit, the rest quiet: every other one a request in 5 s, the others none. Prints how long after its first report
each stream had every bucket assigned; then, over 30 s of steady reports after 20 s of
settling: fundings a second (lease asks), the server's and Redis' CPU, Redis' commands a second
and where Redis' time went, the server's RSS and Redis' memory grown per bucket, what Envoys
would have admitted on the busy buckets (each offered its limit, admitting at the rate it was
assigned, up to what it was offered) against the exact limit, and how many buckets were left
without a live assignment; a line `SCALE {json}` of those figures (sluice-bench reads it); and
the server's RSS once the streams have ended.

    rlqs-scale.py HOST:PORT SERVER_PID REDIS_PORT N BUSY [STREAMS]

scripts/rlqs-scale.sh starts Redis and the server and runs it. Needs the project's .venv
(xds-protos' gRPC stubs).
"""
import json, os, queue, sys, threading, time, subprocess, urllib.request
import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from google.protobuf import duration_pb2

addr, server_pid, redis_port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
n, busy_frac = int(sys.argv[4]), float(sys.argv[5])
streams = int(sys.argv[6]) if len(sys.argv) > 6 else 1
SETTLE_S = int(os.environ.get("SETTLE_S", 20))
MEASURE_S = int(os.environ.get("MEASURE_S", 30))

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

busy_count = int(n * busy_frac)
LIMIT_PER_S = 10.0  # envoy/rlqs/edge.yaml's per-key rule, what a busy bucket is offered

def report(stream, seconds, first):
    """Built once and sent again: a report's content is all that matters here."""
    busy = int(n * busy_frac)
    usages = [rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage(
        bucket_id=rlqs_pb2.BucketId(bucket={"name": "per-key", "key": f"s{stream}k{i}"}),
        time_elapsed=duration_pb2.Duration(seconds=seconds),
        num_requests_allowed=1 if first else (50 if i < busy else (i % 2)), num_requests_denied=0)
        for i in range(n)]
    return rlqs_pb2.RateLimitQuotaUsageReports(domain="edge", bucket_quota_usages=usages)

class Stream:
    def __init__(self, stub, index):
        self.first = report(index, 0, True)
        self.steady = report(index, 5, False)
        self.reports = queue.Queue()
        self.assigned = set()
        self.all_assigned_s = None
        # Per bucket: its last assignment's (time, rate a second or None for a blanket rule,
        # time to live in s); and per busy bucket, the rate changes seen: (time, rate).
        self.last = {}
        self.busy_rates = {}
        responses = stub.StreamRateLimitQuotas(iter(self.reports.get, None))
        threading.Thread(target=self.read, args=(responses,), daemon=True).start()

    def read(self, responses):
        try:
            for r in responses:
                now = time.time()
                for a in r.bucket_action:
                    key = a.bucket_id.bucket["key"]
                    self.assigned.add(key)
                    if not a.HasField("quota_assignment_action"):
                        self.last.pop(key, None)
                        continue
                    q = a.quota_assignment_action
                    tb = q.rate_limit_strategy.token_bucket if q.rate_limit_strategy.HasField("token_bucket") else None
                    rate = tb.tokens_per_fill.value / tb.fill_interval.seconds if tb else None
                    self.last[key] = (now, rate, q.assignment_time_to_live.seconds)
                    if int(key.split("k")[-1]) < busy_count:
                        self.busy_rates.setdefault(key, []).append((now, rate or 0.0))
                if self.all_assigned_s is None and len(self.assigned) == n:
                    self.all_assigned_s = time.time() - self.started
        except grpc.RpcError:
            pass  # the stream ended: this script closed it

    def start(self):
        self.started = time.time()
        self.next_report = self.started + 5
        self.reports.put(self.first)

    def pump(self):
        if time.time() >= self.next_report:
            self.reports.put(self.steady)
            self.next_report += 5

options = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]
channels = [grpc.insecure_channel(addr, options=options) for _ in range(streams)]
rss0, mem0 = rss_kb(server_pid), redis_info("used_memory")
all_streams = [Stream(rlqs_pb2_grpc.RateLimitQuotaServiceStub(c), i) for i, c in enumerate(channels)]
t0 = time.time()
for s in all_streams:
    # A second apart, as Envoys that started apart would.
    s.start()
    time.sleep(1.0 / streams)

def pump(until):
    while time.time() < until:
        for s in all_streams:
            s.pump()
        time.sleep(0.05)

pump(t0 + SETTLE_S)
for i, s in enumerate(all_streams):
    took = "never" if s.all_assigned_s is None else f"{s.all_assigned_s:.2f} s"
    print(f"stream {i}: {len(s.assigned)} of {n} buckets assigned; all {took} after its first report")
rp = int(redis_info("process_id"))
f0, s0 = fundings(), commandstats()
c0s, c0r, cmd0, w0 = cpu_s(server_pid), cpu_s(rp), redis_info("total_commands_processed"), time.time()
pump(w0 + MEASURE_S)
w = time.time() - w0
total = n * streams
print(f"{streams} stream(s) of {n} buckets, {busy_frac:.0%} busy, over {w:.0f} s:")
funded = (fundings() - f0) / w
server_core, redis_core = (cpu_s(server_pid) - c0s) / w, (cpu_s(rp) - c0r) / w
commands = (redis_info("total_commands_processed") - cmd0) / w
print(f"fundings {funded:,.0f}/s")
print(f"server CPU {server_core:.3f} core, Redis CPU {redis_core:.3f} core, Redis {commands:,.0f} commands/s")
s1 = commandstats()
for name, (c, u) in sorted(s1.items(), key=lambda kv: -kv[1][1]):
    dc, du = c - s0.get(name, (0, 0))[0], u - s0.get(name, (0, 0))[1]
    if dc:
        print(f"  {name:<10} {dc / w:>9,.0f} calls/s {du / dc:>8.2f} us a call")
server_b = (rss_kb(server_pid)-rss0)*1024/total
redis_b = (redis_info('used_memory')-mem0)/total
print(f"server RSS +{server_b:,.0f} B a bucket; Redis +{redis_b:,.0f} B a bucket")

def admitted_share(changes, start, end):
    """What a bucket offered LIMIT_PER_S admits over [start, end] at the rates it was assigned
    (changes: (time, rate)), as a fraction of the exact limit over that time."""
    rate, admitted, at = 0.0, 0.0, start
    for t, r in changes:
        if t <= start:
            rate = r
            continue
        if t >= end:
            break
        admitted += min(rate, LIMIT_PER_S) * (t - at)
        rate, at = r, t
    admitted += min(rate, LIMIT_PER_S) * (end - at)
    return admitted / (LIMIT_PER_S * (end - start))

end = w0 + w
shares = sorted(admitted_share(s.busy_rates.get(f"s{i}k{b}", []), w0, end)
                for i, s in enumerate(all_streams) for b in range(busy_count))
lapsed = sum(1 for i, s in enumerate(all_streams) for key in (f"s{i}k{b}" for b in range(n))
             if key not in s.last or s.last[key][0] + s.last[key][2] < end)
if shares:
    mean = sum(shares) / len(shares)
    print(f"busy buckets admit {mean:.3f} of the exact limit (lowest bucket {shares[0]:.3f}); "
          f"{lapsed} of {total} buckets without a live assignment at the end")
seen = {}
for s in all_streams:
    for changes in s.busy_rates.values():
        for t, r in changes:
            if w0 <= t < end:
                seen[r] = seen.get(r, 0) + 1
print("busy buckets' assignments in the window, by rate a second: " +
      ", ".join(f"{r:g}: {c:,}" for r, c in sorted(seen.items(), key=lambda rc: -rc[1])[:8]))
first_s = [s.all_assigned_s for s in all_streams]
print("SCALE " + json.dumps({
    "streams": streams, "buckets": n, "busy": busy_frac, "seconds": round(w, 1),
    "fundings_per_s": round(funded), "server_core": round(server_core, 3),
    "redis_core": round(redis_core, 3), "redis_commands_per_s": round(commands),
    "all_assigned_s": None if None in first_s else round(max(first_s), 2),
    "server_bytes_per_bucket": round(server_b), "redis_bytes_per_bucket": round(redis_b),
    "busy_admitted": round(sum(shares) / len(shares), 4) if shares else None,
    "busy_admitted_lowest": round(shares[0], 4) if shares else None,
    "lapsed": lapsed}), flush=True)
for s in all_streams:
    s.reports.put(None)
for c in channels:
    c.close()
# A departed stream first takes its claims out of the ledgers (a lease ask a bucket), then
# lets its buckets go.
prev = 0
for after in (3, 15, 30):
    time.sleep(after - prev)
    prev = after
    print(f"server RSS {rss_kb(server_pid) / 1024:.1f} MB {after} s after the streams ended (was {rss0 / 1024:.1f} MB before they began)")
