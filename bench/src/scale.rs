//! The quota service at scale: `scripts/rlqs-scale.sh` (a Redis, the release sluice-server, and
//! quota streams as Envoys with a bucket per client keep them), run a few times, its figures
//! set beside the bars issue 56 gave them.

use std::fmt::Write as _;
use std::process::Command;

use serde::Deserialize;

use crate::spread::spread;

/// Buckets each stream reports.
pub const BUCKETS: usize = 50_000;
/// Streams, as Envoys.
pub const STREAMS: usize = 4;
/// The fraction of each stream's buckets offered their whole limit; the rest are quiet.
pub const BUSY: f64 = 0.1;
/// Seconds of steady reports before measuring: quiet buckets settle onto their long spans.
const SETTLE_S: u64 = 45;
/// Seconds measured.
const MEASURE_S: u64 = 30;

/// One run's figures: the `SCALE` line `scripts/rlqs-scale.py` prints.
#[derive(Debug, Clone, Deserialize)]
pub struct ScaleRun {
    pub fundings_per_s: f64,
    pub server_core: f64,
    pub redis_core: f64,
    pub redis_commands_per_s: f64,
    /// The longest any stream waited, from its first report, for all its buckets' assignments.
    pub all_assigned_s: Option<f64>,
    pub server_bytes_per_bucket: f64,
    pub redis_bytes_per_bucket: f64,
    /// What the busy buckets' Envoys would have admitted, against the exact limit.
    pub busy_admitted: Option<f64>,
    pub busy_admitted_lowest: Option<f64>,
    /// Buckets without a live assignment at the end.
    pub lapsed: u64,
}

/// `runs` runs of the script, each in a fresh Redis and server.
pub fn run(runs: usize) -> anyhow::Result<Vec<ScaleRun>> {
    (1..=runs)
        .map(|i| {
            eprintln!("bench: quota streams at scale, run {i} of {runs} ...");
            let output = Command::new("bash")
                .arg("scripts/rlqs-scale.sh")
                .args([BUCKETS.to_string(), BUSY.to_string(), STREAMS.to_string()])
                .env("SETTLE_S", SETTLE_S.to_string())
                .env("MEASURE_S", MEASURE_S.to_string())
                .output()?;
            let stdout = String::from_utf8_lossy(&output.stdout);
            if !output.status.success() {
                anyhow::bail!(
                    "scripts/rlqs-scale.sh failed ({}): {}{}",
                    output.status,
                    stdout,
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            let line = stdout
                .lines()
                .find_map(|l| l.strip_prefix("SCALE "))
                .ok_or_else(|| {
                    anyhow::anyhow!("scripts/rlqs-scale.sh printed no SCALE line: {stdout}")
                })?;
            Ok(serde_json::from_str(line)?)
        })
        .collect()
}

/// The section: one row a figure, median and range over the runs, beside its bar.
pub fn section(runs: &[ScaleRun]) -> anyhow::Result<String> {
    let mut out = String::new();
    writeln!(
        out,
        "`scripts/rlqs-scale.sh {BUCKETS} {BUSY} {STREAMS}`, {} runs: {STREAMS} quota streams (as Envoys, {:.2} s apart) each reporting {BUCKETS} buckets of `envoy/rlqs/edge.yaml`'s per-key rule (gcra 10/s, burst 20) every 5 s; {:.0} % of them offered their whole limit, the rest quiet (half a request in 5 s, half none). Measured over {MEASURE_S} s after {SETTLE_S} s of settling, on the release sluice-server and one Redis. \"Admitted\" is what Envoys would admit on the busy buckets at the rates they were assigned (up to what they were offered), against the exact limit. A bar is met only where the whole range meets it.\n",
        runs.len(),
        1.0 / STREAMS as f64,
        BUSY * 100.0,
    )?;
    writeln!(
        out,
        "| figure | median | range | bar | met |\n|---|---|---|---|---|"
    )?;
    // (figure, each run's value, decimals shown, the bar, and the test: at most (true) or at
    // least (false) this.)
    type Row<'a> = (&'a str, Vec<f64>, usize, &'a str, Option<(bool, f64)>);
    let all = |f: fn(&ScaleRun) -> Option<f64>| -> Vec<f64> { runs.iter().filter_map(f).collect() };
    let rows: [Row; 9] = [
        (
            "fundings a second",
            all(|r| Some(r.fundings_per_s)),
            0,
            "",
            None,
        ),
        (
            "Redis CPU (cores)",
            all(|r| Some(r.redis_core)),
            3,
            "<= 0.3",
            Some((true, 0.3)),
        ),
        (
            "sluice-server CPU (cores)",
            all(|r| Some(r.server_core)),
            3,
            "<= 0.3",
            Some((true, 0.3)),
        ),
        (
            "Redis commands a second",
            all(|r| Some(r.redis_commands_per_s)),
            0,
            "",
            None,
        ),
        (
            "every bucket assigned, s after its stream's first report",
            all(|r| Some(r.all_assigned_s.unwrap_or(f64::INFINITY))),
            2,
            "<= 3",
            Some((true, 3.0)),
        ),
        (
            "Redis bytes a bucket",
            all(|r| Some(r.redis_bytes_per_bucket)),
            0,
            "<= 200",
            Some((true, 200.0)),
        ),
        (
            "sluice-server bytes a bucket",
            all(|r| Some(r.server_bytes_per_bucket)),
            0,
            "<= 1,024",
            Some((true, 1024.0)),
        ),
        (
            "busy buckets admitted / exact",
            all(|r| r.busy_admitted),
            3,
            ">= 0.97",
            Some((false, 0.97)),
        ),
        (
            "buckets without a live assignment",
            all(|r| Some(r.lapsed as f64)),
            0,
            "0",
            Some((true, 0.0)),
        ),
    ];
    for (figure, values, decimals, bar, test) in rows {
        if values.is_empty() {
            continue;
        }
        let (median, low, high) = spread(values);
        let met = match test {
            Some((true, at_most)) => {
                if high <= at_most {
                    "yes"
                } else {
                    "no"
                }
            }
            Some((false, at_least)) => {
                if low >= at_least {
                    "yes"
                } else {
                    "no"
                }
            }
            None => "",
        };
        writeln!(
            out,
            "| {figure} | {median:.decimals$} | {low:.decimals$} to {high:.decimals$} | {bar} | {met} |"
        )?;
    }
    let lowest = all(|r| r.busy_admitted_lowest);
    if !lowest.is_empty() {
        let (median, low, high) = spread(lowest);
        writeln!(
            out,
            "\nThe busy bucket that admitted least, in each run: {median:.3} of the exact limit (median; {low:.3} to {high:.3})."
        )?;
    }
    Ok(out)
}
