//! `sluice-sim compare`: every algorithm at one nominal rate, side by side, on one trace.
//!
//! The comparison is one replay of a policy with six shadow rules, one per algorithm, all
//! keyed the same way: shadow rules decide and count but never deny, so each algorithm sees
//! exactly the traffic of the trace, through the real filter, server and Redis. Beside each,
//! unless leases are off, the same algorithm in lease mode (a seventh to twelfth shadow rule,
//! named `<algorithm>.leased`), decided in Envoy from units leased ahead of need. The report's
//! accuracy section then holds each against the exact limit of the rate.

use std::fmt::Write as _;
use std::str::FromStr;

use serde::Serialize;
use sluice_core::duration::Millis;
use sluice_core::limit::Algorithm;

use crate::accuracy::{self, Accuracy};
use crate::report::html::{self, escape};
use crate::report::{Recorder, Report, charts, tables, text};
use crate::trace::format_time;

/// A rate: `units` per `period`, written `10/1s` or `600/1m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nominal {
    /// Units...
    pub units: u64,
    /// ... per this period.
    pub period: Millis,
}

impl FromStr for Nominal {
    type Err = String;

    fn from_str(text: &str) -> Result<Nominal, String> {
        let (units, period) = text
            .split_once('/')
            .ok_or_else(|| format!("`{text}` is not a rate: write units/period, as 10/1s"))?;
        let units: u64 = units
            .trim()
            .parse()
            .ok()
            .filter(|u| *u > 0)
            .ok_or_else(|| format!("`{units}` is not a positive whole number of requests"))?;
        let period: Millis = period.trim().parse().map_err(|e| format!("{e}"))?;
        Ok(Nominal { units, period })
    }
}

impl std::fmt::Display for Nominal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.units, self.period)
    }
}

/// The six algorithms, in the order the comparison lists them.
pub const ALGORITHMS: [Algorithm; 6] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::Gcra,
];

/// The limit each algorithm is given for `nominal`: `units` per `period`, and buckets of
/// `units` (so that each admits `units` at once, as the windows do).
pub(crate) fn limit_json(algorithm: Algorithm, nominal: Nominal) -> serde_json::Value {
    let (units, period) = (nominal.units, nominal.period.to_string());
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
            serde_json::json!({"algorithm": algorithm.name(), "limit": units, "window": period})
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => {
            serde_json::json!({"algorithm": algorithm.name(), "rate": units, "per": period, "burst": units})
        }
    }
}

/// The name of an algorithm's leased twin.
pub fn leased_name(algorithm: Algorithm) -> String {
    format!("{}.leased", algorithm.name())
}

/// The policy of a comparison: one shadow rule per algorithm, each named after it, on every
/// request, keyed by `key` (the policy language's key parts, e.g. `["client_ip"]`); and, with
/// `lease_horizon`, each algorithm again in lease mode.
pub fn policy(
    nominal: Nominal,
    key: &serde_json::Value,
    cluster: &str,
    lease_horizon: Option<Millis>,
) -> String {
    let mut rules: Vec<serde_json::Value> = ALGORITHMS
        .iter()
        .map(|&a| {
            serde_json::json!({
                "name": a.name(),
                "key": key,
                "limit": limit_json(a, nominal),
                "shadow": true,
            })
        })
        .collect();
    if let Some(horizon) = lease_horizon {
        rules.extend(ALGORITHMS.iter().map(|&a| {
            serde_json::json!({
                "name": leased_name(a),
                "key": key,
                "limit": limit_json(a, nominal),
                "shadow": true,
                // Half the capacity per Envoy, all of it in total: what a small nominal rate
                // needs for a lease to hold more than a unit or two.
                "lease": {"horizon": horizon.to_string(), "max_share": 0.5, "max_total_share": 1.0},
            })
        }));
    }
    serde_json::json!({"cluster": cluster, "timeout": "1s", "rules": rules}).to_string()
}

/// The same algorithm in lease mode.
#[derive(Debug, Clone, Serialize)]
pub struct Leased {
    /// Its accuracy (its bound includes what its Envoys may hold).
    pub accuracy: Accuracy,
    /// Callouts per 1,000 requests.
    pub callouts_per_thousand: Option<f64>,
}

/// One algorithm's line.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The algorithm.
    pub algorithm: String,
    /// Its accuracy.
    #[serde(flatten)]
    pub accuracy: Accuracy,
    /// Callouts per 1,000 requests.
    pub callouts_per_thousand: Option<f64>,
    /// The same in lease mode, when compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leased: Option<Leased>,
}

/// The busiest moment of the fixed window, seen by every algorithm.
#[derive(Debug, Clone, Serialize)]
pub struct Focus {
    /// The key.
    pub key: String,
    /// From, µs.
    pub from_us: i64,
    /// To, µs.
    pub to_us: i64,
    /// Per algorithm, units admitted in the period ending at each moment.
    pub series: Vec<(String, Vec<(i64, u64)>)>,
}

/// The comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The rate.
    pub nominal: String,
    /// Per algorithm.
    pub rows: Vec<Row>,
    /// The fixed window's worst moment, if it went over the exact limit.
    pub focus: Option<Focus>,
}

impl Comparison {
    /// The comparison in a comparison replay's report.
    pub fn build(nominal: Nominal, report: &Report, recorder: &Recorder) -> Comparison {
        let rows: Vec<Row> = ALGORITHMS
            .iter()
            .filter_map(|a| {
                let rule = report.rules.iter().find(|r| r.rule == a.name())?;
                let leased = report
                    .rules
                    .iter()
                    .find(|r| r.rule == leased_name(*a))
                    .and_then(|r| {
                        Some(Leased {
                            accuracy: r.accuracy.clone()?,
                            callouts_per_thousand: r.callouts_per_thousand(),
                        })
                    });
                Some(Row {
                    algorithm: a.name().to_owned(),
                    accuracy: rule.accuracy.clone()?,
                    callouts_per_thousand: rule.callouts_per_thousand(),
                    leased,
                })
            })
            .collect();
        let period_us = nominal.period.as_micros();
        let focus = rows
            .iter()
            .find(|r| r.algorithm == Algorithm::FixedWindow.name())
            .and_then(|r| r.accuracy.peak.clone())
            .filter(|p| p.admitted > nominal.units)
            .map(|peak| {
                let from_us = peak.at_us - 3 * period_us;
                let to_us = peak.at_us + 2 * period_us;
                let series = ALGORITHMS
                    .iter()
                    .map(|a| {
                        let admitted = recorder.admitted_times(a.name(), &peak.key);
                        let steps = accuracy::trailing_counts(&admitted, period_us, 1);
                        let before = steps
                            .iter()
                            .take_while(|(t, _)| *t < from_us)
                            .last()
                            .map_or(0, |s| s.1);
                        let mut visible = vec![(from_us, before)];
                        visible.extend(
                            steps
                                .into_iter()
                                .filter(|(t, _)| (from_us..=to_us).contains(t)),
                        );
                        (a.name().to_owned(), visible)
                    })
                    .collect();
                Focus {
                    key: peak.key,
                    from_us,
                    to_us,
                    series,
                }
            });
        Comparison {
            nominal: nominal.to_string(),
            rows,
            focus,
        }
    }

    /// The table's columns.
    const COLUMNS: [&'static str; 13] = [
        "algorithm",
        "admitted",
        "over exact",
        "peak in a period",
        "own bound",
        "over bound",
        "denied, exact admits",
        "admitted, exact denies",
        "callouts/1k",
        "leased: admitted",
        "over bound",
        "denied, exact admits",
        "callouts/1k",
    ];

    /// The table's rows, with the algorithm's name as `name` gives it.
    fn rows(&self, name: impl Fn(&str) -> String) -> Vec<Vec<String>> {
        let per_thousand = |c: Option<f64>| c.map_or_else(|| "?".to_owned(), |c| format!("{c:.1}"));
        self.rows
            .iter()
            .map(|r| {
                let a = &r.accuracy;
                let e = a.exact.clone().unwrap_or_default();
                let mut row = vec![
                    name(&r.algorithm),
                    tables::thousands(a.admitted),
                    tables::thousands(a.over_exact),
                    a.peak.as_ref().map_or(0, |p| p.admitted).to_string(),
                    tables::thousands(a.bound),
                    tables::thousands(a.over_bound),
                    tables::thousands(e.denied_but_exact_admits),
                    tables::thousands(e.admitted_but_exact_denies),
                    per_thousand(r.callouts_per_thousand),
                ];
                match &r.leased {
                    Some(l) => {
                        let le = l.accuracy.exact.clone().unwrap_or_default();
                        row.extend([
                            tables::thousands(l.accuracy.admitted),
                            tables::thousands(l.accuracy.over_bound),
                            tables::thousands(le.denied_but_exact_admits),
                            per_thousand(l.callouts_per_thousand),
                        ]);
                    }
                    None => row.extend(["-", "-", "-", "-"].map(str::to_owned)),
                }
                row
            })
            .collect()
    }

    /// The terminal table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "every algorithm at {}, each offered every request (shadow rules), against the exact limit;\n(leased: the same algorithm decided in Envoy from leased units, its bound the algorithm's plus what its Envoys may hold)",
            self.nominal
        );
        text::table(&Self::COLUMNS, &self.rows(str::to_owned), 1, &mut out);
        if let Some(f) = &self.focus {
            let _ = writeln!(
                out,
                "fixed_window's worst moment: key {} around {}",
                f.key,
                format_time(f.from_us + (f.to_us - f.from_us) * 3 / 5)
            );
        }
        out
    }

    /// The comparison as a section of an HTML page.
    pub fn html(&self) -> String {
        let mut out = format!(
            "<h2>Every algorithm at {}</h2>\n<p class=\"note\">Each algorithm is a shadow rule offered every request; \"over exact\" counts admitted requests that took their key over {} in the period ending with them.</p>\n",
            escape(&self.nominal),
            escape(&self.nominal)
        );
        out.push_str(&html::table(&Self::COLUMNS, &self.rows(escape)));
        let names: Vec<String> = self.rows.iter().map(|r| r.algorithm.clone()).collect();
        let pick = |f: fn(&Accuracy) -> u64| self.rows.iter().map(|r| f(&r.accuracy)).collect();
        out.push_str("<figure>");
        out.push_str(&charts::grouped_bars(
            "requests each algorithm got wrong, against the exact limit",
            &names,
            &[
                ("admitted over the exact limit", pick(|a| a.over_exact)),
                (
                    "denied, though the exact limit admits",
                    pick(|a| a.exact.as_ref().map_or(0, |e| e.denied_but_exact_admits)),
                ),
            ],
        ));
        out.push_str("</figure>\n");
        if let Some(f) = &self.focus {
            let units: u64 = self
                .nominal
                .split('/')
                .next()
                .and_then(|u| u.parse().ok())
                .unwrap_or(0);
            out.push_str("<figure>");
            out.push_str(&charts::step_lines(
                &format!(
                    "key {}: admitted in the trailing period, around fixed_window's worst moment",
                    f.key
                ),
                "admitted in the period",
                &f.series,
                Some(("exact limit", units)),
                f.from_us,
                f.to_us,
            ));
            out.push_str("</figure>\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_read_as_units_per_period() {
        assert_eq!(
            "10/1s".parse::<Nominal>().unwrap(),
            Nominal {
                units: 10,
                period: "1s".parse().unwrap()
            }
        );
        for bad in ["10", "0/1s", "ten/1s", "10/1x"] {
            assert!(bad.parse::<Nominal>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_policy_has_one_shadow_rule_per_algorithm_that_the_core_accepts() {
        let json = policy(
            "10/1s".parse().unwrap(),
            &serde_json::json!(["client_ip"]),
            "sluice",
            Some("200ms".parse().unwrap()),
        );
        let parsed = sluice_core::policy::Policy::from_json(json.as_bytes()).unwrap();
        assert_eq!(parsed.rules.len(), 12);
        assert!(parsed.rules.iter().all(|r| r.shadow));
        assert_eq!(parsed.rules.iter().filter(|r| r.lease.is_some()).count(), 6);
        for rule in &parsed.rules {
            assert_eq!(rule.limit.nominal_rate().0, 10, "{}", rule.name.as_str());
        }
    }
}
