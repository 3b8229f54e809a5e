//! How long a bucket's fundings cover: a busy share's span, a quiet bucket's, an idle one's,
//! and when a quiet bucket is looked at again.

use crate::key::LimitKey;
use crate::limit::Limit;
#[cfg(doc)]
use crate::rlqs::envoy_bucket::MAX_FILL_INTERVAL_S;

/// How often the server looks at a stream's buckets: fundings happen on these steps.
pub const FUNDING_STEP_MS: u64 = 1000;

/// How early a step funds a refill: one that falls due less than this after the step is
/// funded at it, not a whole step late.
pub const REFILL_EARLY_MS: u64 = FUNDING_STEP_MS / 2;

/// A quiet bucket is funded at least this long at a time, with twice what it was offered over
/// the span (at least two requests), rather than its whole share each second: most buckets of
/// a per-client rule are quiet, and cost Redis one funding in 15 s or more instead of 15. A
/// report that shows it offered more puts it back on fundings of its share at the next tick.
pub const QUIET_SPAN_MS: u64 = 15_000;

/// The longest a quiet bucket is funded for at once: as long as what it asks for takes at
/// most half of what the limit admits at once (its capacity), up to this.
pub const MAX_QUIET_SPAN_MS: u64 = 60_000;

/// A quiet bucket its Envoy was offered nothing for since its last report is funded this long
/// at a time, with a request a minute (the slowest refill Envoy is assigned,
/// [`MAX_FILL_INTERVAL_S`]): most of a per-client rule's buckets are idle, and an idle one
/// costs Redis one funding until the domain's `idle_after` (5 minutes in the shipped config)
/// forgets it. A report that shows a request brings it back at once.
pub const IDLE_SPAN_MS: u64 = 300_000;

/// The longest span a busy bucket's share is funded over at once.
pub const MAX_BUSY_SPAN_MS: u64 = 5_000;

/// How long after a quiet funding the next is due: its span cut by up to a quarter, by how
/// `key` hashes. Buckets first funded together (an Envoy's first report of 50,000 clients) then
/// fall due apart, not all in one step, seconds long, span after span, behind which busy
/// buckets' fundings came late and found the algorithm short. Each funding still pays for the
/// whole span; the next comes before it runs out.
pub(super) fn staggered(span_ms: u64, key: &LimitKey) -> u64 {
    // FNV-1a: the same spread on every server and every run.
    let hash = key
        .as_str()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    span_ms - span_ms / 4 * (hash % 1024) / 1024
}

/// The span a share of at least a request a second is funded over: as many whole seconds of
/// the limit's rate as its burst holds, from one to [`MAX_BUSY_SPAN_MS`]. The Envoys' fundings
/// together take the whole rate over one span, which a bucket algorithm admits at once only
/// within its burst; a window admits by its own windows, and a shaping bucket by its wait,
/// so each is funded second by second. (A bucket of 10/s holding 20 is funded every 2 s: half
/// the Redis calls of one a second, for what Envoys decide the same way, since the assignment
/// is the share's rate, however long the span it is paid over.)
pub fn busy_span_ms(limit: &Limit) -> u64 {
    let fill_ms = match limit.bucket_limit() {
        Some(bucket) if !limit.shapes() => bucket.fill_ms(),
        _ => 0,
    };
    (fill_ms / FUNDING_STEP_MS * FUNDING_STEP_MS).clamp(FUNDING_STEP_MS, MAX_BUSY_SPAN_MS)
}
