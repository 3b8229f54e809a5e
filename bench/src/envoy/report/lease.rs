//! The lease bars: a lease setup's rate on hot keys against no filter's and its floor's, the
//! module's CPU on hot keys, and the calls each lease setup makes on 1,000 keys.

use std::fmt::Write as _;

use sluice_core::lease::LEASED_FROM_UNITS_A_HORIZON;
use sluice_core::policy::raw::RawLease;

use super::judge::{spread, verdict, verdict_where_judged, within_local, within_twice_and_local};
use crate::envoy::plan::{Keys, Results, Run};
use crate::envoy::setup::{LEASE, Setup};

/// `setup` on hot keys answers at least `min` of no filter's requests a second, round by round;
/// and, as the issue asks where a bar sits below what any filter of the kind costs, the same
/// multiple of its `floor`'s (the no-op of its kind), with the floor's own rate beside it.
pub(super) fn rate_bar(
    out: &mut String,
    results: &Results,
    setup: Setup,
    floor: Setup,
    min: f64,
) -> anyhow::Result<()> {
    let rate = |of: Setup, over: Setup| {
        results.paired(Keys::Hot, of, over, |run, base| {
            run.measured.answered_rate() / base.measured.answered_rate()
        })
    };
    let shown = |relative: Vec<f64>| {
        let (median, low, high) = spread(relative);
        format!("{median:.2} [{low:.2} .. {high:.2}]")
    };
    let judged = |relative: Vec<f64>| {
        let met: Vec<bool> = relative.iter().map(|r| *r >= min).collect();
        (shown(relative), verdict(&met))
    };
    let (over_none, met) = judged(rate(setup, Setup::NoFilter));
    writeln!(
        out,
        "- {} on hot keys, at least {min} of no filter's requests a second: {over_none} — {met}.",
        setup.name(),
    )?;
    // The floor's own rate is shown, not judged: the bar is the lease's.
    let floor_over_none = shown(rate(floor, Setup::NoFilter));
    let (over_floor, met) = judged(rate(setup, floor));
    writeln!(
        out,
        "- Its floor, the {} on hot keys, answers {floor_over_none} of no filter's requests a second; {} at least {min} of the floor's: {over_floor} — {met}.",
        floor.name(),
        setup.name(),
    )?;
    Ok(())
}

/// The module's lease-mode bars: its rate and Envoy CPU on hot keys against no filter, the
/// no-op module and `local_ratelimit`, and its calls on 1,000 keys: those the run measured
/// the setups of.
pub(super) fn module_lease_bars(out: &mut String, results: &Results) -> anyhow::Result<()> {
    if results.measured(&[
        Setup::NoFilter,
        Setup::SluiceModuleLease,
        Setup::NoopModule,
        Setup::FloorModule,
        Setup::LocalRatelimit,
    ]) {
        hot_key_bars(out, results)?;
    }
    if results.measured(&[Setup::SluiceModuleLease]) {
        calls_bar(
            out,
            results,
            "Module lease mode",
            Setup::SluiceModuleLease,
            10,
            1,
        )?;
    }
    Ok(())
}

/// The module's lease-mode bars on hot keys: its rate and its Envoy CPU.
fn hot_key_bars(out: &mut String, results: &Results) -> anyhow::Result<()> {
    // The floor is the module that does what any module of sluice's kind must (read the key's
    // header, count, set the decision's filter state), beside which the issue asks a bar be
    // met that sits below it.
    rate_bar(
        out,
        results,
        Setup::SluiceModuleLease,
        Setup::FloorModule,
        0.95,
    )?;
    let lease = results.envoy_added_us(Keys::Hot, Setup::SluiceModuleLease);
    let noop = results.envoy_added_us(Keys::Hot, Setup::NoopModule);
    let floor = results.envoy_added_us(Keys::Hot, Setup::FloorModule);
    let local = results.envoy_added_us(Keys::Hot, Setup::LocalRatelimit);
    let met = within_twice_and_local(&lease, &noop, &local);
    // Said apart: where the multiple cannot be judged, this half still can.
    let rounds_within_local = lease
        .iter()
        .zip(&local)
        .filter(|(l, lo)| within_local(**l, **lo))
        .count();
    writeln!(
        out,
        "- Module lease mode on hot keys, Envoy CPU added at most twice the no-op module's and at most `local_ratelimit`'s plus 3 µs: {:.1} µs against {:.1} and {:.1} — {} (within `local_ratelimit`'s plus 3 µs in {rounds_within_local} of {} rounds).",
        spread(lease.clone()).0,
        spread(noop.clone()).0,
        spread(local.clone()).0,
        verdict_where_judged(&met, "the no-op module"),
        lease.len(),
    )?;
    let floor_over_noop: Vec<f64> = floor.iter().zip(&noop).map(|(f, n)| f / n).collect();
    let met = within_twice_and_local(&lease, &floor, &local);
    // Whether the floor itself stays within `local_ratelimit`'s plus 3 µs: where it does not,
    // that bar sits below what any module of sluice's kind costs.
    let floor_within: Vec<bool> = floor
        .iter()
        .zip(&local)
        .map(|(f, lo)| within_local(*f, *lo))
        .collect();
    let (ratio, low, high) = spread(floor_over_noop);
    writeln!(
        out,
        "- Its floor, the {} on hot keys, adds {:.1} µs, {ratio:.1} [{low:.1} .. {high:.1}] times the no-op module's, itself within `local_ratelimit`'s plus 3 µs in {} of {} rounds; sluice's module in lease mode at most twice the floor's and at most `local_ratelimit`'s plus 3 µs: {:.1} µs against {:.1} and {:.1} — {}.",
        Setup::FloorModule.name(),
        spread(floor.clone()).0,
        floor_within.iter().filter(|within| **within).count(),
        floor_within.len(),
        spread(lease).0,
        spread(floor).0,
        spread(local).0,
        verdict_where_judged(&met, "the floor module")
    )?;
    Ok(())
}

/// `setup`'s lease on 1,000 keys makes at most `most` calls per 1,000 requests, round by round,
/// shown with `decimals`, and how busy each key was beside it.
pub(super) fn calls_bar(
    out: &mut String,
    results: &Results,
    label: &str,
    setup: Setup,
    most: u32,
    decimals: usize,
) -> anyhow::Result<()> {
    let calls: Vec<f64> = results
        .runs(Keys::Many, setup)
        .iter()
        .map(Run::calls_per_1000)
        .collect();
    let met: Vec<bool> = calls.iter().map(|c| *c <= f64::from(most)).collect();
    writeln!(
        out,
        "- {label} on 1,000 keys, at most {most} calls per 1,000 requests: {:.decimals$} — {}{}.",
        spread(calls).0,
        verdict(&met),
        key_traffic(results, setup)?
    )?;
    Ok(())
}

/// What each of the 1,000 keys sent in one lease horizon under `setup`, beside the least a key
/// is leased from: the closed-loop load's rate, and so this, follows the machine's speed, and
/// below that least a key's requests are decided one by one, each a call.
fn key_traffic(results: &Results, setup: Setup) -> anyhow::Result<String> {
    let lease: RawLease = serde_json::from_str(LEASE)?;
    let horizon_s = lease.horizon.as_millis() as f64 / 1000.0;
    let per_horizon: Vec<f64> = results
        .runs(Keys::Many, setup)
        .iter()
        .map(|run| run.measured.answered_rate() / Keys::Many.count() as f64 * horizon_s)
        .collect();
    if per_horizon.is_empty() {
        return Ok(String::new());
    }
    let (median, low, high) = spread(per_horizon);
    Ok(format!(
        " (each key sent {median:.1} [{low:.1} .. {high:.1}] requests a horizon; a key is leased from {LEASED_FROM_UNITS_A_HORIZON})"
    ))
}
