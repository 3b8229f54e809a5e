//! How precise a trace's timestamps really are, and what the replay does about it.
//!
//! Logs record time to the second at best, and some only look precise: a trace whose minute is
//! the same in every line while hours change has only real hours (its minutes and seconds were
//! made up). Replaying all of a second's, minute's or hour's requests at its first instant would
//! invent a burst; so traces coarser than a second are, by default, spread evenly over each step
//! (in file order), and the report says how much of the timing is real.

use serde::Serialize;

use super::record::TraceRecord;

/// The finest step of time a trace's timestamps can be trusted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// Microseconds (or finer).
    Microsecond,
    /// Milliseconds.
    Millisecond,
    /// Seconds: what access logs usually record.
    Second,
    /// Minutes.
    Minute,
    /// Hours only.
    Hour,
}

impl Resolution {
    /// The step in microseconds.
    pub fn micros(self) -> i64 {
        match self {
            Resolution::Microsecond => 1,
            Resolution::Millisecond => 1_000,
            Resolution::Second => 1_000_000,
            Resolution::Minute => 60_000_000,
            Resolution::Hour => 3_600_000_000,
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Resolution::Microsecond => "1 µs",
            Resolution::Millisecond => "1 ms",
            Resolution::Second => "1 s",
            Resolution::Minute => "1 min",
            Resolution::Hour => "1 h",
        }
    }
}

/// Whether to spread the requests of each timestamp step over the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Spread {
    /// Spread when the timestamps are coarser than a second (only minutes or hours are real).
    Auto,
    /// Replay every request at its logged time.
    Off,
    /// Spread evenly over each step, whatever the resolution.
    Even,
}

/// What the reader found out about a trace's timestamps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Timing {
    /// The finest step the timestamps can be trusted to.
    pub resolution: Resolution,
    /// What showed it.
    pub evidence: String,
    /// Whether each step's requests were spread evenly over the step, in file order.
    pub spread: bool,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            resolution: Resolution::Microsecond,
            evidence: String::new(),
            spread: false,
        }
    }
}

impl Timing {
    /// One line for the report: how much of the timing is real.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "timestamps have {} resolution ({})",
            self.resolution.name(),
            self.evidence
        );
        if self.spread {
            text.push_str(&format!(
                "; the requests of each {} step are spread evenly over it, in file order, so timing finer than {} is not real",
                self.resolution.name(),
                self.resolution.name()
            ));
        } else if self.resolution >= Resolution::Second {
            text.push_str(&format!(
                "; the requests of each {} step arrive together at its start (--spread even spreads them over it)",
                self.resolution.name()
            ));
        }
        text
    }

    /// Whether `spread` asks to spread a trace of this resolution.
    pub fn should_spread(resolution: Resolution, spread: Spread) -> bool {
        match spread {
            Spread::Off => false,
            Spread::Even => resolution >= Resolution::Millisecond,
            Spread::Auto => resolution >= Resolution::Minute,
        }
    }
}

/// Fewer records than this say nothing about resolutions coarser than a second.
const ENOUGH: usize = 20;

fn part(time_us: i64, unit: i64, modulo: i64) -> i64 {
    time_us.div_euclid(unit).rem_euclid(modulo)
}

/// The resolution of `records`' timestamps, and the evidence.
pub fn detect(records: &[TraceRecord]) -> (Resolution, String) {
    let all = |f: &dyn Fn(i64) -> bool| records.iter().all(|r| f(r.time_us));
    if !all(&|t| t % 1_000_000 == 0) {
        return if all(&|t| t % 1_000 == 0) {
            (
                Resolution::Millisecond,
                "times to the millisecond".to_owned(),
            )
        } else {
            (
                Resolution::Microsecond,
                "times to the microsecond".to_owned(),
            )
        };
    }
    let distinct = |unit: i64| {
        let mut steps: Vec<i64> = records.iter().map(|r| r.time_us.div_euclid(unit)).collect();
        steps.sort_unstable();
        steps.dedup();
        steps.len()
    };
    let constant = |unit: i64, modulo: i64| -> Option<i64> {
        let first = part(records.first()?.time_us, unit, modulo);
        all(&|t| part(t, unit, modulo) == first).then_some(first)
    };
    if records.len() >= ENOUGH
        && distinct(Resolution::Hour.micros()) >= 2
        && let Some(minute) = constant(60_000_000, 60)
    {
        let seconds_vary = constant(1_000_000, 60).is_none();
        return (
            Resolution::Hour,
            if seconds_vary {
                format!(
                    "every timestamp has minute :{minute:02} while the seconds vary: only the hour is real"
                )
            } else {
                format!("every timestamp is at minute :{minute:02}")
            },
        );
    }
    if records.len() >= ENOUGH
        && distinct(Resolution::Minute.micros()) >= 2
        && let Some(second) = constant(1_000_000, 60)
    {
        return (
            Resolution::Minute,
            format!("every timestamp is at second :{second:02}"),
        );
    }
    (
        Resolution::Second,
        "every timestamp is a whole second".to_owned(),
    )
}

/// The step each record falls in.
pub fn step(record: &TraceRecord, resolution: Resolution) -> i64 {
    record.time_us.div_euclid(resolution.micros())
}

/// Spreads the records of each step evenly over it, keeping their order. `records` must be
/// in step order.
pub fn spread_evenly(records: &mut [TraceRecord], resolution: Resolution) {
    let unit = resolution.micros();
    let mut start = 0;
    while start < records.len() {
        let this = step(&records[start], resolution);
        let end = start
            + records[start..]
                .iter()
                .take_while(|r| step(r, resolution) == this)
                .count();
        let n = (end - start) as i64;
        for (i, record) in records[start..end].iter_mut().enumerate() {
            record.time_us = this * unit + (i as i64) * unit / n;
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(times_s: &[i64]) -> Vec<TraceRecord> {
        times_s
            .iter()
            .map(|t| TraceRecord {
                line: 0,
                time_us: t * 1_000_000,
                client: "c".to_owned(),
                method: "GET".to_owned(),
                target: "/".to_owned(),
                host: None,
                status: 200,
                bytes: 0,
                headers: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn whole_seconds_are_second_resolution() {
        let records = at(&(0..100).map(|i| 1_000_000 + i * 7).collect::<Vec<_>>());
        assert_eq!(detect(&records).0, Resolution::Second);
    }

    #[test]
    fn a_constant_minute_across_hours_leaves_only_the_hour() {
        // 10:05:xx, 11:05:xx ... with seconds all over the place.
        let times: Vec<i64> = (0..60)
            .map(|i| 36_000 + (i / 20) * 3600 + 300 + (i * 13) % 60)
            .collect();
        let (resolution, evidence) = detect(&at(&times));
        assert_eq!(resolution, Resolution::Hour);
        assert!(evidence.contains("minute :05"), "{evidence}");
    }

    #[test]
    fn whole_minutes_are_minute_resolution() {
        let times: Vec<i64> = (0..30).map(|i| 36_000 + i * 60 + (i % 7) * 600).collect();
        assert_eq!(detect(&at(&times)).0, Resolution::Minute);
    }

    #[test]
    fn a_short_trace_claims_no_more_than_seconds() {
        assert_eq!(detect(&at(&[0, 3600, 7200])).0, Resolution::Second);
    }

    #[test]
    fn spreading_keeps_order_and_fills_each_step_evenly() {
        let mut records = at(&[10, 10, 10, 10, 11]);
        for (i, r) in records.iter_mut().enumerate() {
            r.line = i + 1;
        }
        spread_evenly(&mut records, Resolution::Second);
        let times: Vec<i64> = records.iter().map(|r| r.time_us).collect();
        assert_eq!(
            times,
            [10_000_000, 10_250_000, 10_500_000, 10_750_000, 11_000_000]
        );
        assert_eq!(
            records.iter().map(|r| r.line).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
    }
}
