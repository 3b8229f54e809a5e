//! One usage report of an Envoy's `rate_limit_quota` filter, checked: what the quota service
//! decides from. The server makes it from the protobuf message, naming the field of anything
//! it refuses.
//!
//! Envoy 1.40 reports a new bucket at once, with `time_elapsed` 0, and then every bucket it
//! knows every 5 s in whole seconds, whatever its `reporting_interval` (`scripts/rlqs-probe.py`).

use super::BucketId;

/// One message: a domain's buckets and their use since the last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The filter's `domain`, in every message.
    pub domain: String,
    /// Each bucket's use.
    pub usages: Vec<Usage>,
}

/// One bucket's use since it was last reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The bucket id: the entries the filter's `bucket_id_builder` made.
    pub bucket: BucketId,
    /// The time the counts cover, in whole seconds; 0 on a bucket's first report.
    pub elapsed_s: u64,
    /// Requests the Envoy admitted.
    pub allowed: u64,
    /// Requests it denied.
    pub denied: u64,
}

impl Usage {
    /// The requests a second the bucket was offered at this Envoy, allowed or denied; `None`
    /// for a first report, which covers no time.
    pub fn demand_per_s(&self) -> Option<f64> {
        (self.elapsed_s > 0)
            .then(|| (self.allowed.saturating_add(self.denied)) as f64 / self.elapsed_s as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_is_what_was_offered_over_the_time_reported_and_unknown_over_none() {
        let usage = |elapsed_s, allowed, denied| Usage {
            bucket: BucketId::default(),
            elapsed_s,
            allowed,
            denied,
        };
        assert_eq!(usage(5, 40, 10).demand_per_s(), Some(10.0));
        assert_eq!(usage(0, 1, 0).demand_per_s(), None);
        assert_eq!(
            usage(5, u64::MAX, 1).demand_per_s(),
            Some(u64::MAX as f64 / 5.0)
        );
    }
}
