//! How a figure is judged against a bar: the median and range of its rounds, and whether
//! every round meets it.

use std::fmt::Write as _;

pub(super) use crate::spread::spread;

/// Whether a single figure meets a bar.
pub(super) fn plain(met: bool) -> &'static str {
    if met { "**met**" } else { "**not met**" }
}

/// Whether every round meets a bar: `met`, `not met`, or, where rounds differ, that the range
/// straddles it.
pub(super) fn verdict(per_round: &[bool]) -> &'static str {
    if per_round.is_empty() {
        // `--only` left out a setup the bar needs.
        "not measured"
    } else if per_round.iter().all(|&m| m) {
        "**met** in every round"
    } else if per_round.iter().any(|&m| m) {
        "**not met**: the rounds straddle it"
    } else {
        "**not met** in any round"
    }
}

/// Whether `figure` is at most `times` a baseline's Envoy CPU added, in one round: `None` where
/// the baseline added none over no filter's (at most zero, as a no-op filter's does on a fast
/// machine, within its noise). No multiple of that is a bar: twice a negative figure would
/// hold a filter to costing less than no filter, and twice zero to a cost no measurement
/// resolves.
pub(super) fn within_multiple(figure: f64, times: f64, baseline: f64) -> Option<bool> {
    (baseline > 0.0).then_some(figure <= times * baseline)
}

/// [`verdict`] over rounds of which those where the baseline named by `baseline` added no CPU
/// (`None`, see [`within_multiple`]) are not judged, and the verdict says so.
pub(super) fn verdict_where_judged(per_round: &[Option<bool>], baseline: &str) -> String {
    let judged: Vec<bool> = per_round.iter().flatten().copied().collect();
    let unjudged = per_round.len() - judged.len();
    if unjudged == 0 {
        return verdict(&judged).to_owned();
    }
    let why =
        format!("{baseline} added no Envoy CPU over no filter's, and no multiple of that is a bar");
    if judged.is_empty() {
        format!("**not judged**: in every round {why}")
    } else {
        let judged_in = match judged.len() {
            1 => "the one round".to_owned(),
            n => format!("the {n} rounds"),
        };
        format!(
            "over {judged_in} where it could be judged, {}; not judged in {unjudged}, where {why}",
            verdict(&judged),
        )
    }
}

/// How far over `local_ratelimit`'s Envoy CPU added a leased module may go, in µs.
const OVER_LOCAL_US: f64 = 3.0;

/// Whether Envoy CPU added `figure` is at most `local_ratelimit`'s `local` plus
/// [`OVER_LOCAL_US`].
pub(super) fn within_local(figure: f64, local: f64) -> bool {
    figure <= local + OVER_LOCAL_US
}

/// Per round, whether the lease's Envoy CPU added is at most twice `baseline`'s and at most
/// `local_ratelimit`'s plus 3 µs: not met where it is over the latter, whatever the former;
/// otherwise as [`within_multiple`] judges the former.
pub(super) fn within_twice_and_local(
    lease: &[f64],
    baseline: &[f64],
    local: &[f64],
) -> Vec<Option<bool>> {
    lease
        .iter()
        .zip(baseline.iter().zip(local))
        .map(|(l, (b, lo))| {
            if within_local(*l, *lo) {
                within_multiple(*l, 2.0, *b)
            } else {
                Some(false)
            }
        })
        .collect()
}

/// A bar on a ratio at most `max` in every round: its median, range (to `digits` places) and
/// verdict.
pub(super) fn ratio_bar(
    out: &mut String,
    bar: &str,
    ratios: &[f64],
    max: f64,
    digits: usize,
) -> anyhow::Result<()> {
    let met: Vec<bool> = ratios.iter().map(|r| *r <= max).collect();
    let (median, low, high) = spread(ratios.to_vec());
    writeln!(
        out,
        "- {bar}: {median:.digits$} [{low:.digits$} .. {high:.digits$}] — {}.",
        verdict(&met)
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multiple_of_a_baseline_that_added_nothing_is_not_judged() {
        assert_eq!(within_multiple(3.0, 2.0, 2.0), Some(true));
        assert_eq!(within_multiple(5.0, 2.0, 2.0), Some(false));
        assert_eq!(
            within_multiple(-0.5, 2.0, -0.7),
            None,
            "twice a negative is no bar"
        );
        assert_eq!(within_multiple(0.0, 2.0, 0.0), None);
        let noop = "the no-op module";
        assert_eq!(
            verdict_where_judged(&[Some(true), Some(true)], noop),
            "**met** in every round"
        );
        assert_eq!(
            verdict_where_judged(&[None, None, None], noop),
            "**not judged**: in every round the no-op module added no Envoy CPU over no filter's, and no multiple of that is a bar"
        );
        assert_eq!(
            verdict_where_judged(&[None, Some(false), None], noop),
            "over the one round where it could be judged, **not met** in any round; not judged in 2, where the no-op module added no Envoy CPU over no filter's, and no multiple of that is a bar"
        );
        assert_eq!(
            verdict_where_judged(&[Some(true), None, Some(false)], noop),
            "over the 2 rounds where it could be judged, **not met**: the rounds straddle it; not judged in 1, where the no-op module added no Envoy CPU over no filter's, and no multiple of that is a bar"
        );
    }

    #[test]
    fn a_lease_over_local_ratelimits_plus_3_us_fails_even_where_the_multiple_cannot_be_judged() {
        // Rounds: within both; over twice the baseline; over `local_ratelimit`'s plus 3 µs with
        // a baseline that added nothing; within it, the baseline having added nothing.
        let lease = [3.0, 5.0, 4.5, -0.5];
        let noop = [2.0, 2.0, -0.7, -0.7];
        let local = [1.0, 3.0, 1.0, -1.4];
        assert_eq!(
            within_twice_and_local(&lease, &noop, &local),
            [Some(true), Some(false), Some(false), None]
        );
    }
}
