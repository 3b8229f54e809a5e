#!/usr/bin/env python3
"""The reference rate limit service's documented examples, asked of sluice-server through the
gRPC stubs Envoy's API package ships (xds-protos: envoy.service.ratelimit.v3.rls_pb2_grpc).

    rls_reference.py --grpc HOST:PORT --metrics URL

The server must load examples/ratelimit/ and take the caller's time (--replay-time): every call
is made at the same instant, so windows never roll over mid-example. Prints `ok <example>` for
each, and exits non-zero naming the first answer that differs from the documented one.
Run by `make test` (tests/e2e/rls_reference.rs).
"""

import argparse
import sys
import urllib.request

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
Unit = rls_pb2.RateLimitResponse.RateLimit
# Half a second into a second, a minute and a day.
AT_US = "1700006400500000"
EXAMPLES = []


class Differs(Exception):
    pass


def expect(condition, what):
    if not condition:
        raise Differs(what)


def example(function):
    EXAMPLES.append(function)
    return function


def descriptor(*entries, hits=None):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return d


class Service:
    def __init__(self, grpc_target, metrics_url):
        self.stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(grpc_target))
        self.metrics_url = metrics_url

    def ask(self, domain, *descriptors, hits_addend=0):
        request = rls_pb2.RateLimitRequest(
            domain=domain, descriptors=list(descriptors), hits_addend=hits_addend
        )
        return self.stub.ShouldRateLimit(
            request, metadata=[("x-sluice-replay-time-us", AT_US)], timeout=10
        )

    def metrics(self):
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            return response.read().decode()


def limit_of(status):
    if not status.HasField("current_limit"):
        return None
    return (status.current_limit.requests_per_unit, status.current_limit.unit)


@example
def example_1_each_value_is_limited_on_its_own(rls):
    answer = rls.ask("mongo_cps", descriptor(("database", "users")), hits_addend=500)
    status = answer.statuses[0]
    expect(answer.overall_code == OK, f"500 of 500: {answer}")
    expect(limit_of(status) == (500, Unit.SECOND), f"the limit: {status}")
    expect(status.limit_remaining == 0, f"none left: {status}")
    reset = status.duration_until_reset
    expect(0 < reset.seconds * 1e9 + reset.nanos <= 1e9, f"reset within the second: {reset}")
    answer = rls.ask("mongo_cps", descriptor(("database", "users")))
    expect(answer.overall_code == OVER_LIMIT, f"the 501st: {answer}")
    headers = {h.key: h.value for h in answer.response_headers_to_add}
    expect(
        headers == {"RateLimit-Limit": "500", "RateLimit-Remaining": "0", "RateLimit-Reset": "1"},
        f"the reference's headers: {headers}",
    )
    other = rls.ask("mongo_cps", descriptor(("database", "default"))).statuses[0]
    expect(other.code == OK and other.limit_remaining == 499, f"default's own counter: {other}")
    none = rls.ask("mongo_cps", descriptor(("database", "orders"))).statuses[0]
    expect(none.code == OK and limit_of(none) is None, f"no limit for another value: {none}")


@example
def example_2_nested_descriptors_and_several_per_request(rls):
    marketing = descriptor(("message_type", "marketing"), ("to_number", "2061111111"))
    any_kind = descriptor(("to_number", "2061111111"))
    for i in range(5):
        answer = rls.ask("messaging", marketing, any_kind)
        expect(answer.overall_code == OK, f"marketing message {i + 1} of 5: {answer}")
    answer = rls.ask("messaging", marketing, any_kind)
    expect(answer.overall_code == OVER_LIMIT, f"the 6th marketing message: {answer}")
    expect(
        [s.code for s in answer.statuses] == [OVER_LIMIT, OK],
        f"only the marketing limit is over: {answer}",
    )
    expect(limit_of(answer.statuses[1]) == (100, Unit.DAY), f"{answer.statuses[1]}")
    other = rls.ask(
        "messaging", descriptor(("message_type", "marketing"), ("to_number", "2062222222"))
    )
    expect(other.overall_code == OK, f"another number has its own 5: {other}")
    # sluice: the denied 6th consumed nothing, so 95 of the 100 are left.
    answer = rls.ask("messaging", any_kind, hits_addend=95)
    expect(answer.overall_code == OK and answer.statuses[0].limit_remaining == 0, f"{answer}")
    answer = rls.ask("messaging", any_kind)
    expect(answer.overall_code == OVER_LIMIT, f"the 101st message to one number: {answer}")


@example
def example_3_the_most_specific_match_wins(rls):
    blocked = rls.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.5")))
    expect(blocked.overall_code == OVER_LIMIT, f"50.0.0.5 is blocked: {blocked}")
    expect(limit_of(blocked.statuses[0]) == (0, Unit.SECOND), f"{blocked.statuses[0]}")
    for i in range(10):
        answer = rls.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.1")))
        expect(answer.overall_code == OK, f"request {i + 1} of 10: {answer}")
        expect(answer.statuses[0].limit_remaining == 9 - i, f"{answer.statuses[0]}")
    answer = rls.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.1")))
    expect(answer.overall_code == OVER_LIMIT, f"the 11th: {answer}")


@example
def example_4_a_limit_applies_at_its_own_depth(rls):
    deep = rls.ask("example4", descriptor(("key", "value"), ("subkey", "subvalue")))
    expect(limit_of(deep.statuses[0]) == (300, Unit.SECOND), f"{deep}")
    shallow = rls.ask("example4", descriptor(("key", "value")))
    expect(limit_of(shallow.statuses[0]) is None, f"one tuple matches no limit: {shallow}")


@example
def example_5_unlimited(rls):
    answer = rls.ask("internal", descriptor(("ldap", "query")), descriptor(("azure", "blob")))
    ldap, azure = answer.statuses
    expect(ldap.code == OK and ldap.limit_remaining == 2**32 - 1, f"unlimited: {ldap}")
    expect(limit_of(ldap) is None, f"{ldap}")
    expect(limit_of(azure) == (100, Unit.MINUTE) and azure.limit_remaining == 99, f"{azure}")


@example
def example_6_shadow_mode_counts_but_never_limits(rls):
    user_a = descriptor(("service", "auth-service"), ("user", "user-a"))
    for i in range(11):
        answer = rls.ask("example6", user_a)
        expect(answer.overall_code == OK, f"user-a request {i + 1}: {answer}")
    expect(answer.statuses[0].limit_remaining == 0, f"over its limit: {answer}")
    user_b = descriptor(("service", "auth-service"), ("user", "user-b"))
    for i in range(20):
        expect(rls.ask("example6", user_b).overall_code == OK, f"user-b request {i + 1}")
    expect(rls.ask("example6", user_b).overall_code == OVER_LIMIT, "user-b's 21st")
    metrics = rls.metrics()
    line = 'ratelimit_service_rate_limit_shadow_mode{domain="example6",key1="service",key2="user_user-a"} 1'
    expect(line in metrics, f"the shadow breach is counted: no `{line}`")


@example
def example_7_replaces(rls):
    specific = descriptor(("key_1", "value_1"), ("user", "bkthomps"))
    for i in range(5):
        expect(rls.ask("example7", specific).overall_code == OK, f"request {i + 1} of 5")
    expect(rls.ask("example7", specific).overall_code == OVER_LIMIT, "the 6th alone: 5 a second")
    replacing = descriptor(("key_2", "value_2"), ("user", "bkthomps"))
    answer = rls.ask("example7", specific, replacing)
    expect(answer.overall_code == OK, f"the specific limit is replaced: {answer}")
    expect(limit_of(answer.statuses[0]) is None, f"{answer.statuses[0]}")
    expect(limit_of(answer.statuses[1]) == (10, Unit.SECOND), f"{answer.statuses[1]}")


@example
def example_8_detailed_metric(rls):
    answer = rls.ask("example8", descriptor(("key1", "unspecified_value")))
    expect(limit_of(answer.statuses[0]) == (10, Unit.MINUTE), f"{answer}")
    answer = rls.ask("example8", descriptor(("key1", "value1")))
    expect(limit_of(answer.statuses[0]) == (20, Unit.MINUTE), f"{answer}")
    metrics = rls.metrics()
    for key in ("key1_unspecified_value", "key1_value1"):
        line = f'ratelimit_service_rate_limit_total_hits{{domain="example8",key1="{key}",key2=""}} 1'
        expect(line in metrics, f"no `{line}`")


@example
def example_9_wildcards(rls):
    cases = [
        (("key1", "value7"), (20, Unit.MINUTE)),
        (("path", "/api/123/action"), (20, Unit.MINUTE)),
        (("path", "/api/123/other"), None),
        (("route", "/api/v2/resource/456/action"), (20, Unit.MINUTE)),
    ]
    for entry, limit in cases:
        answer = rls.ask("example9", descriptor(entry))
        expect(limit_of(answer.statuses[0]) == limit, f"{entry}: {answer}")


@example
def hits_addend_of_the_request_and_of_a_descriptor(rls):
    address = descriptor(("remote_address", "50.0.0.9"))
    for left in (7, 4, 1):
        answer = rls.ask("edge_proxy_per_ip", address, hits_addend=3)
        expect(answer.statuses[0].limit_remaining == left, f"3 hits each: {answer}")
    expect(
        rls.ask("edge_proxy_per_ip", address, hits_addend=3).overall_code == OVER_LIMIT,
        "3 hits with 1 left",
    )
    asking = rls.ask("edge_proxy_per_ip", descriptor(("remote_address", "50.0.0.9"), hits=0))
    expect(asking.overall_code == OK and asking.statuses[0].limit_remaining == 1, f"{asking}")


@example
def a_malformed_request_is_refused_with_a_reason(rls):
    try:
        rls.ask("", descriptor(("k", "v")))
    except grpc.RpcError as e:
        expect(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{e.code()}")
        expect("domain must not be empty" in e.details(), f"{e.details()}")
    else:
        raise Differs("a request without a domain was answered")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grpc", required=True)
    parser.add_argument("--metrics", required=True)
    args = parser.parse_args()
    rls = Service(args.grpc, args.metrics)
    for run in EXAMPLES:
        try:
            run(rls)
        except Differs as e:
            print(f"FAIL {run.__name__}: {e}", file=sys.stderr)
            return 1
        print(f"ok {run.__name__}")
    print(f"{len(EXAMPLES)} examples ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
