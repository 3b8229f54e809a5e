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
    /// The requests a second the bucket was offered at this Envoy, allowed or denied, over the
    /// time the report covers ([`Usage::covered_ms`]); `None` for a bucket's first report,
    /// which covers none.
    pub fn demand_per_s(&self, since_last_ms: Option<u64>) -> Option<f64> {
        let covered_ms = self.covered_ms(since_last_ms);
        (covered_ms > 0).then(|| self.offered() as f64 * 1000.0 / covered_ms as f64)
    }

    /// The requests the bucket was offered at this Envoy, allowed or denied.
    pub fn offered(&self) -> u64 {
        self.allowed.saturating_add(self.denied)
    }

    /// The time the report covers, in milliseconds; 0 for a bucket's first report.
    ///
    /// Envoy counts `time_elapsed` in whole seconds, cut down: a report of 4 s may cover 4.99,
    /// and a new bucket's first periodic report, under a second after the one that announced
    /// it, says 0. `since_last_ms`, the time since the server took this bucket's last report,
    /// says which: the time covered is taken as that, within the whole second Envoy names.
    /// (A client that sends its reports faster than the time they claim is taken at its word.)
    pub fn covered_ms(&self, since_last_ms: Option<u64>) -> u64 {
        let named_ms = self.elapsed_s.saturating_mul(1000);
        match since_last_ms {
            Some(since) => since.clamp(named_ms, named_ms.saturating_add(999)),
            None => named_ms,
        }
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
        assert_eq!(usage(5, 40, 10).demand_per_s(None), Some(10.0));
        assert_eq!(usage(0, 1, 0).demand_per_s(None), None, "a first report");
        assert_eq!(
            usage(5, u64::MAX, 1).demand_per_s(None),
            Some(u64::MAX as f64 / 5.0)
        );
        // Envoy cuts 4.99 s down to 4: the server's own measure says how much it cut.
        assert_eq!(usage(4, 40, 9).demand_per_s(Some(4_900)), Some(10.0));
        assert_eq!(
            usage(0, 3, 0).demand_per_s(Some(300)),
            Some(10.0),
            "a periodic report under a second after the first"
        );
        assert_eq!(
            usage(5, 50, 0).demand_per_s(Some(100)),
            Some(10.0),
            "a report sent early is taken at its word"
        );
        assert_eq!(
            usage(5, 50, 0).demand_per_s(Some(60_000)),
            Some(50.0 / 5.999),
            "never more than a second over what Envoy names"
        );
        assert_eq!(usage(0, 1, 0).demand_per_s(Some(0)), None);
    }
}
