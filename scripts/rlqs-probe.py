"""A probe Rate Limit Quota Service, to see what Envoy's `rate_limit_quota` filter does.

It logs every usage report an Envoy sends (bucket id, time_elapsed, allowed, denied, with the
time it came), answers each new bucket with a token bucket of MAXT tokens refilled one a second,
and pushes the same assignment again every PUSH seconds (0: never), with a TTL of TTL seconds
(-1: unset). Run with the project's venv, which has grpcio and xds-protos:

    .venv/bin/python scripts/rlqs-probe.py PORT PUSH TTL [MAXT]

and point an Envoy's `rlqs_server` at 127.0.0.1:PORT (scripts/rlqs-probe-envoy.yaml does, with
a bucket per `x-api-key` and a catch-all). What it showed of Envoy 1.40 is in the notes of
issue 48 and, once sluice serves the protocol, in docs/rlqs.md.
"""
import sys, time, threading, queue
from concurrent import futures
import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2 as p, rlqs_pb2_grpc as g
from envoy.type.v3 import ratelimit_strategy_pb2 as rs

PORT = sys.argv[1]
PUSH = float(sys.argv[2])      # seconds between re-pushes, 0: never
TTL = int(sys.argv[3])         # assignment TTL seconds, -1: unset
MAXT = int(sys.argv[4]) if len(sys.argv) > 4 else 5
T0 = time.time()
def log(*a): print(f"{time.time()-T0:7.2f}", *a, flush=True)

def assignment(bucket_id, abandon=False):
    r = p.RateLimitQuotaResponse()
    a = r.bucket_action.add()
    a.bucket_id.CopyFrom(bucket_id)
    if abandon:
        a.abandon_action.SetInParent()
        return r
    q = a.quota_assignment_action
    if TTL >= 0:
        q.assignment_time_to_live.seconds = TTL
    t = q.rate_limit_strategy.token_bucket
    t.max_tokens = MAXT
    t.tokens_per_fill.value = 1
    t.fill_interval.seconds = 1
    return r

class S(g.RateLimitQuotaServiceServicer):
    def StreamRateLimitQuotas(self, it, ctx):
        events = queue.Queue()
        def read():
            try:
                for m in it: events.put(("report", m))
            except Exception as e:
                log("read ended", e)
            events.put(("end", None))
        threading.Thread(target=read, daemon=True).start()
        log("stream open", ctx.peer())
        buckets = {}
        next_push = time.time() + PUSH if PUSH > 0 else None
        while True:
            timeout = max(0.01, next_push - time.time()) if next_push else None
            try:
                kind, m = events.get(timeout=timeout)
            except queue.Empty:
                for key, bid in buckets.items():
                    log("push", dict(bid.bucket))
                    yield assignment(bid)
                next_push = time.time() + PUSH
                continue
            if kind == "end":
                log("stream closed"); return
            for u in m.bucket_quota_usages:
                key = tuple(sorted(u.bucket_id.bucket.items()))
                log("report", dict(u.bucket_id.bucket), f"elapsed={u.time_elapsed.seconds}", f"allowed={u.num_requests_allowed}", f"denied={u.num_requests_denied}")
                if key not in buckets:
                    buckets[key] = u.bucket_id
                    log("assign", dict(u.bucket_id.bucket))
                    yield assignment(u.bucket_id)

server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
g.add_RateLimitQuotaServiceServicer_to_server(S(), server)
server.add_insecure_port(f"127.0.0.1:{PORT}")
server.start()
server.wait_for_termination()
