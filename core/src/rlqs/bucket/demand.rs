//! What a bucket claims of its limit's rate, from what its Envoy's reports show it was offered.

/// A bucket claims a share by what its Envoy was offered this many times over: the Envoy's
/// traffic wavers between reports, and an Envoy given exactly what it was offered is denied
/// whenever it is offered a little more. (5 % of the limit is what an Envoy under it can leave
/// unused, against full use of 0.97 of it when the Envoys together are over it.)
pub const DEMAND_HEADROOM: f64 = 1.05;

/// The least a bucket its Envoy still reports claims, in requests a second: enough to admit a
/// first request now and then, little enough that the others' shares are not cut for it.
pub const LEAST_DEMAND_PER_S: f64 = 0.1;

/// Traffic paced at a steady rate shows a request more or less in one report than the next (4
/// a second: 19, 21, 19, ...), which is more than [`DEMAND_HEADROOM`] covers. A report within
/// this fraction of the last two together is read as those two: the same traffic, steadier.
/// One further off is a change of traffic, and counts at once.
pub const STEADY_WITHIN: f64 = 0.1;

/// The requests a second a report shows, given its window (requests, and the milliseconds they
/// cover) and the last report's: the two together while the latest alone is within
/// [`STEADY_WITHIN`] of them, else the latest.
pub(super) fn steady_demand(last: Option<(u64, u64)>, (offered, ms): (u64, u64)) -> f64 {
    let rate = |offered: u64, ms: u64| offered as f64 * 1000.0 / ms.max(1) as f64;
    let latest = rate(offered, ms);
    let Some((last_offered, last_ms)) = last else {
        return latest;
    };
    let both = rate(
        last_offered.saturating_add(offered),
        last_ms.saturating_add(ms),
    );
    if (latest - both).abs() <= STEADY_WITHIN * both {
        both
    } else {
        latest
    }
}
