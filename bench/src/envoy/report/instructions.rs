//! The real-Envoy section's counts in instructions: every counted setup's median and range
//! over its rounds, and the module's two cost bars judged round by round.

use std::fmt::Write as _;

use super::judge::{ratio_bar, spread};
use crate::envoy::instructions;
use crate::envoy::plan::{Count, Keys, Results};
use crate::envoy::setup::Setup;

/// Envoy's instructions a request under callgrind, and the module's two cost bars judged on
/// them round by round, where they were counted.
pub(super) fn section(out: &mut String, results: &Results) -> anyhow::Result<()> {
    if results.counts.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "**In instructions.** Envoy under callgrind (`scripts/envoy-instructions.sh`), one worker, {} requests on one hot key after 500 to warm up, and the lease bar's setups again on {} hot keys, their requests interleaved as in the rounds above (fewer keys than the rounds' {}: at callgrind's pace of 70 to 140 requests a second each of those came about once in the leases' 100 ms tick, and its purse went back to the allowance and was filled again between its requests, which a hot key at full speed never does), for about as long after 5 s, each count divided by the requests Envoy's listener completed (its own counter); the lease setups lease with `{}` when counted, their horizon forty times the rounds', as callgrind serves requests about a hundred times slower: a key's grant is its traffic over the horizon, and at the rounds' horizon a hot key under callgrind was granted a few units, refilled its purse every few requests and had its lease renewed every few dozen, work the rounds at full speed do once in hundreds of requests; every setup counted {} times, a round at a time, each cell the median with the range in brackets: a count moves by a few hundred instructions from run to run. *Worker*: the worker thread's instructions a request, what a request costs; *over no filter*: the worker's count less no filter's in the same round; *main*: the main thread's over the same span (stats, the module's lease tick and lease calls), work by the second that callgrind's slow pace spreads over some 40 times fewer requests than Envoy serves at full speed.\n\n| setup | worker | over no filter | main |\n|---|---|---|---|",
        instructions::REQUESTS,
        instructions::COUNTED_HOT_KEYS,
        Keys::Hot.count(),
        instructions::COUNTED_LEASE,
        instructions::ROUNDS,
    )?;
    let mut counted: Vec<(Setup, usize)> = Vec::new();
    for count in &results.counts {
        if !counted.contains(&(count.setup, count.keys)) {
            counted.push((count.setup, count.keys));
        }
    }
    let cell = |values: Vec<f64>| {
        let (median, low, high) = spread(values);
        format!("{median:.0} [{low:.0} .. {high:.0}]")
    };
    for &(setup, keys) in &counted {
        let counts = counts_of(results, setup, keys);
        let added: Vec<f64> = counted_over(results, setup, Setup::NoFilter, keys)
            .into_iter()
            .map(|(_, added)| added)
            .collect();
        let name = match (instructions::counted_name(setup), keys) {
            (name, 1) => name,
            (name, keys) => format!("{name}, {keys} hot keys"),
        };
        writeln!(
            out,
            "| {name} | {} | {} | {} |",
            cell(counts.iter().map(|c| c.worker as f64).collect()),
            if added.is_empty() {
                String::new()
            } else {
                cell(added)
            },
            cell(counts.iter().map(|c| c.main as f64).collect()),
        )?;
    }
    writeln!(out)?;
    let judged = |out: &mut String, bar: &str, setup, base, keys, max: f64| {
        let ratios = ratios_over(results, setup, base, keys);
        if ratios.is_empty() {
            writeln!(out, "- {bar}: not counted.")?;
            return Ok(());
        }
        ratio_bar(out, bar, &ratios, max, 3)
    };
    judged(
        out,
        "In instructions, sluice's module per request adds at most 0.8 times the native `ratelimit` filter's",
        Setup::SluiceModule,
        Setup::NativeGrpc,
        1,
        0.8,
    )?;
    floor_line(
        out,
        results,
        Floor {
            bar: "the per-request bar",
            floor: Setup::CalloutFloorModule,
            does: "reads the key's header, posts one check to sluice-server through Envoy's cluster and, on the answer, bumps two counters and sets the decision's filter state, as sluice's module asks of Envoy per request",
            base: Setup::NativeGrpc,
            base_name: "the native `ratelimit` filter's",
            sluice: Setup::SluiceModule,
            own: "sluice's module per request",
            own_work: "its plan, the body written, the answer read, the verdicts concluded",
            keys: 1,
        },
    )?;
    let hot_keys = format!(
        "on {} hot keys, interleaved",
        instructions::COUNTED_HOT_KEYS
    );
    for (keys, on) in [
        (1, "on one hot key"),
        (instructions::COUNTED_HOT_KEYS, hot_keys.as_str()),
    ] {
        judged(
            out,
            &format!(
                "In instructions, sluice's module in lease mode {on} adds at most twice the no-op module's"
            ),
            Setup::SluiceModuleLease,
            Setup::NoopModule,
            keys,
            2.0,
        )?;
        floor_line(
            out,
            results,
            Floor {
                bar: "that bar",
                floor: Setup::FloorModule,
                does: "reads the key's header, bumps two counters and sets the decision's filter state, as sluice's lease path asks of Envoy",
                base: Setup::NoopModule,
                base_name: "the no-op module's",
                sluice: Setup::SluiceModuleLease,
                own: "sluice's lease path",
                own_work: "its own deciding, the lease taken, the record written",
                keys,
            },
        )?;
    }
    writeln!(out)?;
    Ok(())
}

/// A floor under a bar: the module that does what any module of sluice's kind must ask of
/// Envoy there, and nothing else.
struct Floor {
    /// The bar it stands under, as the line names it.
    bar: &'static str,
    floor: Setup,
    /// What the floor module does, after "a module that".
    does: &'static str,
    /// The bar's baseline, and its name with a possessive.
    base: Setup,
    base_name: &'static str,
    /// sluice's setup the bar is on, and what its line calls it.
    sluice: Setup,
    own: &'static str,
    /// What sluice does over the floor.
    own_work: &'static str,
    /// The keys the counts cycled through.
    keys: usize,
}

/// What any module of sluice's kind asks of Envoy (the floor), as a multiple of the bar's
/// baseline, and what sluice adds over it: the part of the bar that is sluice's own.
fn floor_line(out: &mut String, results: &Results, floor: Floor) -> anyhow::Result<()> {
    let multiple = ratios_over(results, floor.floor, floor.base, floor.keys);
    let own: Vec<f64> = paired_over(results, floor.sluice, floor.floor, floor.keys)
        .into_iter()
        .map(|(sluice, floor)| sluice - floor)
        .collect();
    if multiple.is_empty() || own.is_empty() {
        return Ok(());
    }
    let (multiple, low, high) = spread(multiple);
    let (own, own_low, own_high) = spread(own);
    writeln!(
        out,
        "- The floor under {}: a module that {}, and does nothing else, adds {multiple:.3} [{low:.3} .. {high:.3}] times {}; {} adds {own:.0} [{own_low:.0} .. {own_high:.0}] instructions over that floor: {}.",
        floor.bar, floor.does, floor.base_name, floor.own, floor.own_work,
    )?;
    Ok(())
}

/// What `setup` adds over no filter as a multiple of what `base` adds, on `keys` keys, in each
/// round both were counted in.
fn ratios_over(results: &Results, setup: Setup, base: Setup, keys: usize) -> Vec<f64> {
    paired_over(results, setup, base, keys)
        .into_iter()
        .map(|(added, base_added)| added / base_added)
        .collect()
}

/// What `setup` and `base` each add over no filter, on `keys` keys, in each round both were
/// counted in.
fn paired_over(results: &Results, setup: Setup, base: Setup, keys: usize) -> Vec<(f64, f64)> {
    let bases = counted_over(results, base, Setup::NoFilter, keys);
    counted_over(results, setup, Setup::NoFilter, keys)
        .into_iter()
        .filter_map(|(round, added)| {
            let (_, base_added) = bases.iter().find(|(r, _)| *r == round)?;
            Some((added, *base_added))
        })
        .collect()
}

/// `setup`'s counts under callgrind on `keys` keys, round by round.
fn counts_of(results: &Results, setup: Setup, keys: usize) -> Vec<&Count> {
    let mut counts: Vec<&Count> = results
        .counts
        .iter()
        .filter(|c| c.setup == setup && c.keys == keys)
        .collect();
    counts.sort_by_key(|c| c.round);
    counts
}

/// The worker's instructions a request `setup` adds over `base` on `keys` keys, by round, in
/// each round both were counted in.
fn counted_over(results: &Results, setup: Setup, base: Setup, keys: usize) -> Vec<(usize, f64)> {
    counts_of(results, setup, keys)
        .into_iter()
        .filter_map(|count| {
            let base = results
                .counts
                .iter()
                .find(|b| b.setup == base && b.keys == keys && b.round == count.round)?;
            Some((count.round, count.worker as f64 - base.worker as f64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE_BAR: &str = "lease mode on one hot key";

    fn count(setup: Setup, round: usize, worker: u64) -> Count {
        count_on(setup, 1, round, worker)
    }

    fn count_on(setup: Setup, keys: usize, round: usize, worker: u64) -> Count {
        Count {
            setup,
            round,
            keys,
            worker,
            main: 500,
        }
    }

    /// The instructions section for these counts.
    fn section_of(counts: Vec<Count>) -> String {
        let results = Results {
            seconds: 0,
            turns: 0,
            runs: Vec::new(),
            start_ups: Vec::new(),
            over_limit: Vec::new(),
            counts,
        };
        let mut out = String::new();
        section(&mut out, &results).unwrap();
        out
    }

    /// The line of the instructions section for these counts that contains `text`.
    fn line_with(counts: Vec<Count>, text: &str) -> String {
        section_of(counts)
            .lines()
            .find(|line| line.contains(text))
            .unwrap()
            .to_owned()
    }

    #[test]
    fn an_instruction_bar_is_judged_round_by_round_against_the_same_rounds_baselines() {
        // No filter drifts by 1,000 between rounds: each round's own count is what a setup
        // is measured over, so the ratios are 1.9, 2.1 and 1.95.
        let mut counts = Vec::new();
        for (round, none) in [240_000, 241_000, 242_000].into_iter().enumerate() {
            let lease = [9_500, 10_500, 9_750][round];
            counts.push(count(Setup::NoFilter, round, none));
            counts.push(count(Setup::NoopModule, round, none + 5_000));
            counts.push(count(Setup::SluiceModuleLease, round, none + lease));
        }
        let line = line_with(counts.clone(), LEASE_BAR);
        assert!(
            line.ends_with(": 1.950 [1.900 .. 2.100] — **not met**: the rounds straddle it."),
            "{line}"
        );
        // Every round under the bar meets it.
        counts.retain(|c| !(c.setup == Setup::SluiceModuleLease && c.round == 1));
        let line = line_with(counts, LEASE_BAR);
        assert!(line.contains("**met** in every round"), "{line}");
    }

    #[test]
    fn the_floor_is_a_multiple_of_the_no_op_and_the_lease_is_measured_over_it_round_by_round() {
        let mut counts = Vec::new();
        for (round, none) in [240_000, 241_000, 242_000].into_iter().enumerate() {
            counts.push(count(Setup::NoFilter, round, none));
            counts.push(count(Setup::NoopModule, round, none + 4_000));
            counts.push(count(
                Setup::FloorModule,
                round,
                none + [6_000, 6_400, 6_200][round],
            ));
            counts.push(count(Setup::SluiceModuleLease, round, none + 8_000));
        }
        let line = line_with(counts.clone(), "The floor under that bar");
        assert!(
            line.contains("adds 1.550 [1.500 .. 1.600] times the no-op module's"),
            "{line}"
        );
        assert!(
            line.contains("adds 1800 [1600 .. 2000] instructions over that floor"),
            "{line}"
        );
        // Without the floor counted, there is no floor to speak of.
        counts.retain(|c| c.setup != Setup::FloorModule);
        let out = section_of(counts);
        assert!(!out.contains("The floor under that bar"), "{out}");
    }

    #[test]
    fn the_per_request_floor_is_a_multiple_of_the_native_filter_and_the_module_over_it() {
        let mut counts = Vec::new();
        for (round, none) in [240_000, 241_000, 242_000].into_iter().enumerate() {
            counts.push(count(Setup::NoFilter, round, none));
            counts.push(count(Setup::NativeGrpc, round, none + 137_000));
            counts.push(count(
                Setup::CalloutFloorModule,
                round,
                none + [105_000, 106_000, 107_000][round],
            ));
            counts.push(count(Setup::SluiceModule, round, none + 109_000));
        }
        let line = line_with(counts, "The floor under the per-request bar");
        assert!(
            line.contains("adds 0.774 [0.766 .. 0.781] times the native `ratelimit` filter's"),
            "{line}"
        );
        assert!(
            line.contains(
                "sluice's module per request adds 3000 [2000 .. 4000] instructions over that floor"
            ),
            "{line}"
        );
    }

    #[test]
    fn the_lease_bar_on_hot_keys_is_judged_on_counts_on_hot_keys_alone() {
        // One key's counts and the hot keys' counts of the same setups, each against its own
        // no filter and no-op module: 1.5 times on one key, 2.5 on the hot keys.
        let hot = instructions::COUNTED_HOT_KEYS;
        let mut counts = Vec::new();
        for round in 0..3 {
            counts.push(count(Setup::NoFilter, round, 240_000));
            counts.push(count(Setup::NoopModule, round, 244_000));
            counts.push(count(Setup::SluiceModuleLease, round, 246_000));
            counts.push(count_on(Setup::NoFilter, hot, round, 230_000));
            counts.push(count_on(Setup::NoopModule, hot, round, 234_000));
            counts.push(count_on(Setup::SluiceModuleLease, hot, round, 240_000));
        }
        let out = section_of(counts);
        let line = |text: &str| out.lines().find(|l| l.contains(text)).unwrap().to_owned();
        assert!(
            line(LEASE_BAR).contains(": 1.500 [1.500 .. 1.500] — **met**"),
            "{out}"
        );
        assert!(
            line(&format!("lease mode on {hot} hot keys, interleaved"))
                .contains(": 2.500 [2.500 .. 2.500] — **not met**"),
            "{out}"
        );
        assert!(
            out.contains(&format!("| sluice module, lease `{{\"horizon\": \"20s\"}}`, {hot} hot keys | 240000 [240000 .. 240000] | 10000 [10000 .. 10000] |")),
            "{out}"
        );
    }
}
