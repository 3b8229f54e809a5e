//! A usage report from protobuf, checked: each refusal a gRPC `InvalidArgument` naming the field.
//! The checks are the filter's API's (`rlqs.proto`'s validation rules) but one: `time_elapsed`
//! may be 0, as Envoy 1.40 sends it on a bucket's first report.

use sluice_core::rlqs::report::{Report, Usage};
use tonic::Status;

use crate::envoy_api::quota::RateLimitQuotaUsageReports;

/// The most bytes of keys and values one bucket id may hold. Envoy's `bucket_id_builder` makes
/// a few short entries; a client sending more would make the server keep them per bucket.
pub const MAX_BUCKET_ID_BYTES: usize = 1024;

/// `message` as a [`Report`], or the status refusing it.
pub fn from_proto(message: RateLimitQuotaUsageReports) -> Result<Report, Status> {
    let refuse = |field: &str, reason: &str| Status::invalid_argument(format!("{field}: {reason}"));
    if message.domain.is_empty() {
        return Err(refuse("domain", "must not be empty"));
    }
    if message.bucket_quota_usages.is_empty() {
        return Err(refuse(
            "bucket_quota_usages",
            "must hold at least one usage",
        ));
    }
    let mut usages = Vec::with_capacity(message.bucket_quota_usages.len());
    for (i, usage) in message.bucket_quota_usages.into_iter().enumerate() {
        let field = |name: &str| format!("bucket_quota_usages[{i}].{name}");
        let Some(bucket_id) = usage.bucket_id else {
            return Err(refuse(&field("bucket_id"), "is required"));
        };
        if bucket_id.bucket.is_empty() {
            return Err(refuse(
                &field("bucket_id.bucket"),
                "must hold at least one entry",
            ));
        }
        if let Some((key, _)) = bucket_id
            .bucket
            .iter()
            .find(|(k, v)| k.is_empty() || v.is_empty())
        {
            return Err(refuse(
                &field("bucket_id.bucket"),
                &format!("`{key}`: keys and values must not be empty"),
            ));
        }
        let bytes: usize = bucket_id
            .bucket
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        if bytes > MAX_BUCKET_ID_BYTES {
            return Err(refuse(
                &field("bucket_id.bucket"),
                &format!("holds {bytes} bytes of keys and values, more than {MAX_BUCKET_ID_BYTES}"),
            ));
        }
        let Some(elapsed) = usage.time_elapsed else {
            return Err(refuse(&field("time_elapsed"), "is required"));
        };
        let Ok(elapsed_s) = u64::try_from(elapsed.seconds) else {
            return Err(refuse(&field("time_elapsed"), "must not be negative"));
        };
        usages.push(Usage {
            bucket: bucket_id.bucket.into_iter().collect(),
            elapsed_s,
            allowed: usage.num_requests_allowed,
            denied: usage.num_requests_denied,
        });
    }
    Ok(Report {
        domain: message.domain,
        usages,
    })
}

#[cfg(test)]
mod tests {
    use crate::envoy_api::protobuf::Duration;
    use crate::envoy_api::quota::{BucketId, BucketQuotaUsage};

    use super::*;

    fn usage(entries: &[(&str, &str)], seconds: Option<i64>) -> BucketQuotaUsage {
        BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: entries
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            }),
            time_elapsed: seconds.map(|seconds| Duration { seconds, nanos: 0 }),
            num_requests_allowed: 7,
            num_requests_denied: 3,
        }
    }

    fn report(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: usages,
        }
    }

    #[test]
    fn a_report_as_envoy_sends_it_is_taken_a_first_one_with_no_time_included() {
        let taken = from_proto(report(
            "shop",
            vec![usage(&[("name", "per-key"), ("key", "k1")], Some(0))],
        ))
        .unwrap();
        assert_eq!(taken.domain, "shop");
        let usage = &taken.usages[0];
        assert_eq!((usage.elapsed_s, usage.allowed, usage.denied), (0, 7, 3));
        assert_eq!(usage.bucket.get("key"), Some("k1"));
    }

    #[test]
    fn a_malformed_report_is_refused_naming_the_field() {
        let refused = |message| {
            let status = from_proto(message).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            status.message().to_owned()
        };
        assert_eq!(
            refused(report("", vec![usage(&[("k", "v")], Some(5))])),
            "domain: must not be empty"
        );
        assert_eq!(
            refused(report("d", vec![])),
            "bucket_quota_usages: must hold at least one usage"
        );
        assert_eq!(
            refused(report(
                "d",
                vec![usage(&[("k", "v")], Some(5)), usage(&[], Some(5))]
            )),
            "bucket_quota_usages[1].bucket_id.bucket: must hold at least one entry"
        );
        assert_eq!(
            refused(report("d", vec![usage(&[("k", "")], Some(5))])),
            "bucket_quota_usages[0].bucket_id.bucket: `k`: keys and values must not be empty"
        );
        assert_eq!(
            refused(report("d", vec![usage(&[("k", "v")], None)])),
            "bucket_quota_usages[0].time_elapsed: is required"
        );
        assert_eq!(
            refused(report("d", vec![usage(&[("k", "v")], Some(-1))])),
            "bucket_quota_usages[0].time_elapsed: must not be negative"
        );
        let long = "v".repeat(MAX_BUCKET_ID_BYTES);
        assert_eq!(
            refused(report("d", vec![usage(&[("k", &long)], Some(5))])),
            "bucket_quota_usages[0].bucket_id.bucket: holds 1025 bytes of keys and values, more than 1024"
        );
        let mut no_id = usage(&[("k", "v")], Some(5));
        no_id.bucket_id = None;
        assert_eq!(
            refused(report("d", vec![no_id])),
            "bucket_quota_usages[0].bucket_id: is required"
        );
    }
}
