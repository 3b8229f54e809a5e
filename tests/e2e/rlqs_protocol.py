#!/usr/bin/env python3
"""sluice-server's Rate Limit Quota Service, spoken to through the gRPC stubs Envoy's API
package ships (xds-protos: envoy.service.rate_limit_quota.v3.rlqs_pb2_grpc), with the shipped
configuration envoy/rlqs/edge.yaml.

    rlqs_protocol.py --grpc HOST:PORT --metrics URL

Prints `ok <check>` for each, and exits non-zero naming the first that fails.
Run by `make test` (tests/e2e/rlqs_protocol.rs).
"""

import argparse
import queue
import sys
import threading
import urllib.request

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from envoy.type.v3 import ratelimit_strategy_pb2
from google.protobuf import duration_pb2

ALLOW_ALL = ratelimit_strategy_pb2.RateLimitStrategy.ALLOW_ALL
CHECKS = []


class Failed(Exception):
    pass


def expect(condition, what):
    if not condition:
        raise Failed(what)


def check(function):
    CHECKS.append(function)
    return function


def usage(bucket, allowed=1, denied=0, seconds=0):
    return rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage(
        bucket_id=rlqs_pb2.BucketId(bucket=bucket),
        time_elapsed=duration_pb2.Duration(seconds=seconds),
        num_requests_allowed=allowed,
        num_requests_denied=denied,
    )


class Stream:
    """One Envoy's stream: reports go in through a queue, answers come out through another."""

    def __init__(self, stub):
        self.reports = queue.Queue()
        self.answers = queue.Queue()
        responses = stub.StreamRateLimitQuotas(iter(self.reports.get, None))
        threading.Thread(target=self._read, args=(responses,), daemon=True).start()

    def _read(self, responses):
        try:
            for response in responses:
                self.answers.put(response)
        except grpc.RpcError as error:
            self.answers.put(error)

    def report(self, domain, *usages):
        self.reports.put(rlqs_pb2.RateLimitQuotaUsageReports(domain=domain, bucket_quota_usages=list(usages)))

    def next(self, timeout=5):
        try:
            return self.answers.get(timeout=timeout)
        except queue.Empty:
            raise Failed(f"nothing came within {timeout}s")

    def action_for(self, bucket, timeout=5):
        while True:
            answer = self.next(timeout)
            expect(not isinstance(answer, grpc.RpcError), f"the stream ended: {answer}")
            for action in answer.bucket_action:
                if dict(action.bucket_id.bucket) == bucket:
                    return action

    def close(self):
        self.reports.put(None)


class Service:
    def __init__(self, grpc_target, metrics_url):
        self.stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(grpc.insecure_channel(grpc_target))
        self.metrics_url = metrics_url

    def metric(self, name):
        text = urllib.request.urlopen(self.metrics_url).read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


KEY = {"name": "per-key", "key": "k1"}


@check
def a_new_bucket_gets_a_token_bucket_with_a_time_to_live(service):
    stream = Stream(service.stub)
    stream.report("edge", usage(KEY))
    action = stream.action_for(KEY)
    assignment = action.quota_assignment_action
    expect(assignment.assignment_time_to_live.seconds == 10, f"ttl: {assignment}")
    bucket = assignment.rate_limit_strategy.token_bucket
    expect(
        (bucket.max_tokens, bucket.tokens_per_fill.value, bucket.fill_interval.seconds) == (10, 10, 1),
        f"gcra 10/s alone is 10 tokens a second: {bucket}",
    )
    stream.close()


@check
def an_internal_key_is_allowed_whole(service):
    stream = Stream(service.stub)
    internal = {"name": "per-key", "key": "internal-batch"}
    stream.report("edge", usage(internal))
    strategy = stream.action_for(internal).quota_assignment_action.rate_limit_strategy
    expect(strategy.blanket_rule == ALLOW_ALL, f"{strategy}")
    stream.close()


@check
def a_malformed_report_ends_its_own_stream_naming_the_field(service):
    good = Stream(service.stub)
    good.report("edge", usage(KEY))
    good.action_for(KEY)
    bad = Stream(service.stub)
    broken = usage(KEY)
    broken.ClearField("time_elapsed")
    bad.report("edge", broken)
    error = bad.next()
    expect(isinstance(error, grpc.RpcError), f"not refused: {error}")
    expect(error.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{error.code()}")
    expect(
        error.details() == "bucket_quota_usages[0].time_elapsed: is required",
        f"{error.details()}",
    )
    # The other stream goes on: its assignment is renewed every 3.3 s, at a step a second
    # (a loaded machine's steps come late).
    good.action_for(KEY, timeout=8)
    good.close()


@check
def reports_and_streams_are_counted(service):
    before = service.metric("sluice_rlqs_reports_total")
    stream = Stream(service.stub)
    stream.report("edge", usage(KEY, allowed=3, denied=2, seconds=5))
    stream.action_for(KEY)
    expect(service.metric("sluice_rlqs_reports_total") == before + 1, "reports_total")
    expect(service.metric("sluice_rlqs_streams") >= 1, "streams")
    stream.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc", required=True)
    parser.add_argument("--metrics", required=True)
    args = parser.parse_args()
    service = Service(args.grpc, args.metrics)
    for function in CHECKS:
        try:
            function(service)
        except Failed as failure:
            print(f"FAILED {function.__name__}: {failure}")
            sys.exit(1)
        print(f"ok {function.__name__}")
    print(f"{len(CHECKS)} checks ok")


if __name__ == "__main__":
    main()
