//! The migration preview: the descriptors of an Envoy configuration decided by the rate limit
//! YAML as written (the reference's fixed window, unless a descriptor picks a sluice algorithm)
//! and by each of sluice's six algorithms at the same rate, side by side, per descriptor path.
//!
//! Each variant is its own replay through the native filter's model, against its own Redis, so
//! each decides every request as it would alone in production: unlike the .wasm's comparison
//! (shadow rules), an algorithm that denies here also spares the request its other
//! descriptors, as sluice-server's all-or-nothing decisions do.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;
use sluice_core::limit::Algorithm;
use sluice_core::rls::Unit;

use super::session::{self, NativeSession};
use crate::compare::{ALGORITHMS, Nominal, limit_json};
use crate::report::{Report, tables, text};
use crate::trace::Trace;

/// How the limits of one replay are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The YAML as written.
    AsWritten,
    /// Every limit on this algorithm, at its `requests_per_unit` per `unit`.
    Algorithm(Algorithm),
}

impl Variant {
    /// Its name in the table.
    pub fn name(self) -> String {
        match self {
            Variant::AsWritten => "as written".to_owned(),
            Variant::Algorithm(a) => a.name().to_owned(),
        }
    }
}

/// One variant's line for one descriptor path.
#[derive(Debug, Clone, Serialize)]
pub struct VariantRow {
    /// The variant.
    pub variant: String,
    /// The algorithm the path was decided by.
    pub algorithm: String,
    /// Requests that sent the descriptor.
    pub offered: u64,
    /// Admitted.
    pub admitted: u64,
    /// Denied.
    pub denied: u64,
    /// Admitted, taking their value over the nominal rate in the period ending with them.
    pub over_exact: u64,
    /// Denied, though an exact limit of the rate admits them.
    pub denied_exact_admits: u64,
    /// Admitted, though an exact limit of the rate denies them.
    pub admitted_exact_denies: u64,
    /// Values denied at least once.
    pub values_limited: u64,
    /// The value denied most, and how many times.
    pub most_limited: Option<(String, u64)>,
}

/// One descriptor path's rows.
#[derive(Debug, Clone, Serialize)]
pub struct PathComparison {
    /// The path (`domain.key`, `domain.key_value.key`, ...).
    pub path: String,
    /// Its rate, as units/period.
    pub nominal: String,
    /// Per variant, as written first.
    pub rows: Vec<VariantRow>,
}

/// The preview.
#[derive(Debug, Clone, Serialize)]
pub struct RlsComparison {
    /// Per descriptor path with a limit that the trace offered.
    pub paths: Vec<PathComparison>,
}

/// Replays `trace` through `session` once per variant; `progress` hears which variant runs.
pub fn run(
    session: &NativeSession,
    trace: &Trace,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<RlsComparison> {
    let dir = TempDir::new()?;
    let mut variants = vec![Variant::AsWritten];
    variants.extend(ALGORITHMS.iter().map(|&a| Variant::Algorithm(a)));
    let mut paths: Vec<PathComparison> = Vec::new();
    for (i, variant) in variants.into_iter().enumerate() {
        progress(&variant.name());
        let files = variant_files(&session.rls_config, variant, &dir.0.join(i.to_string()))?;
        let one = NativeSession {
            config: session.config.clone(),
            config_name: session.config_name.clone(),
            rls_config: files,
            instances: session.instances,
            callout_latency: session.callout_latency,
            redis: session.redis.clone(),
            top: usize::MAX,
        };
        let outcome = session::run(&one, trace, &mut |_| {})
            .with_context(|| format!("the replay with every limit {}", variant.name()))?;
        add_rows(&mut paths, variant, &outcome.report);
    }
    Ok(RlsComparison { paths })
}

fn add_rows(paths: &mut Vec<PathComparison>, variant: Variant, report: &Report) {
    for rule in &report.rules {
        let (Some(limit), Some(accuracy)) = (rule.limit, rule.accuracy.as_ref()) else {
            continue;
        };
        let mut limited = report.top_limited.iter().filter(|k| k.rule == rule.rule);
        let most_limited = limited
            .clone()
            .max_by_key(|k| k.counts.denied)
            .map(|k| (k.key.clone(), k.counts.denied));
        let exact = accuracy.exact.clone().unwrap_or_default();
        let row = VariantRow {
            variant: variant.name(),
            algorithm: limit.algorithm().name().to_owned(),
            offered: rule.counts.offered,
            admitted: rule.counts.allowed,
            denied: rule.counts.denied,
            over_exact: accuracy.over_exact,
            denied_exact_admits: exact.denied_but_exact_admits,
            admitted_exact_denies: exact.admitted_but_exact_denies,
            values_limited: limited.by_ref().count() as u64,
            most_limited,
        };
        match paths.iter_mut().find(|p| p.path == rule.rule) {
            Some(path) => path.rows.push(row),
            None => {
                let (units, period) = limit.nominal_rate();
                paths.push(PathComparison {
                    path: rule.rule.clone(),
                    nominal: format!("{units}/{period}"),
                    rows: vec![row],
                });
            }
        }
    }
}

/// The rate limit files of `paths` with every limit set as `variant` says, written under
/// `dir`.
pub fn variant_files(
    paths: &[PathBuf],
    variant: Variant,
    dir: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let files = sluice_server::config_files::files(paths)
        .map_err(|e| anyhow::anyhow!("--rls-config: {e}"))?;
    let mut written = Vec::with_capacity(files.len());
    for (i, file) in files.iter().enumerate() {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let mut document: Value = serde_yaml_ng::from_str(&text)
            .with_context(|| format!("{}: not YAML", file.display()))?;
        if let Variant::Algorithm(algorithm) = variant
            && let Some(descriptors) = document.get_mut("descriptors")
        {
            set_algorithm(descriptors, algorithm);
        }
        let out = dir.join(format!("{i}.yaml"));
        std::fs::write(&out, serde_yaml_ng::to_string(&document)?)
            .with_context(|| format!("writing {}", out.display()))?;
        written.push(out);
    }
    Ok(written)
}

/// Every limited `rate_limit` under `descriptors` decided by `algorithm` at its own rate.
fn set_algorithm(descriptors: &mut Value, algorithm: Algorithm) {
    let Some(list) = descriptors.as_array_mut() else {
        return;
    };
    for descriptor in list {
        if let Some(limit) = descriptor
            .get_mut("rate_limit")
            .and_then(Value::as_object_mut)
            && limit.get("unlimited").and_then(Value::as_bool) != Some(true)
            && let Some(nominal) = nominal_of(limit)
        {
            limit.insert("sluice".to_owned(), limit_json(algorithm, nominal));
        }
        if let Some(children) = descriptor.get_mut("descriptors") {
            set_algorithm(children, algorithm);
        }
    }
}

/// A `rate_limit`'s `requests_per_unit` per `unit`; `None` for one the server will refuse
/// anyway (and name).
fn nominal_of(limit: &serde_json::Map<String, Value>) -> Option<Nominal> {
    let units = limit
        .get("requests_per_unit")?
        .as_u64()
        .filter(|u| *u > 0)?;
    let name = limit.get("unit")?.as_str()?.to_ascii_lowercase();
    let unit = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
    ]
    .into_iter()
    .find(|u| u.name() == name)?;
    Some(Nominal {
        units,
        period: unit.window(),
    })
}

impl RlsComparison {
    const COLUMNS: [&'static str; 10] = [
        "limits",
        "algorithm",
        "admitted",
        "denied",
        "over exact",
        "denied, exact admits",
        "admitted, exact denies",
        "values limited",
        "most limited",
        "",
    ];

    /// The terminal tables, one per descriptor path.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for path in &self.paths {
            let offered = path.rows.first().map_or(0, |r| r.offered);
            let _ = writeln!(
                out,
                "{} at {} ({} requests sent it): the YAML as written, then every algorithm at its rate",
                path.path,
                path.nominal,
                tables::thousands(offered)
            );
            let rows: Vec<Vec<String>> = path
                .rows
                .iter()
                .map(|r| {
                    let (value, denied) = r.most_limited.clone().map_or_else(
                        || ("-".to_owned(), String::new()),
                        |(v, n)| (v, format!("{n} denied")),
                    );
                    vec![
                        r.variant.clone(),
                        r.algorithm.clone(),
                        tables::thousands(r.admitted),
                        tables::thousands(r.denied),
                        tables::thousands(r.over_exact),
                        tables::thousands(r.denied_exact_admits),
                        tables::thousands(r.admitted_exact_denies),
                        tables::thousands(r.values_limited),
                        value,
                        denied,
                    ]
                })
                .collect();
            text::table(&Self::COLUMNS, &rows, 2, &mut out);
            out.push('\n');
        }
        if self.paths.is_empty() {
            out.push_str("no descriptor with a limit was sent by the trace's requests\n");
        }
        out.push_str(
            "  (over exact: admitted requests that took their value over the rate in the period ending with them;\n   denied, exact admits / admitted, exact denies: against an exact sliding-log limit of the rate)\n",
        );
        out
    }
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        let dir = std::env::temp_dir().join(format!(
            "sluice-sim-compare-{}-{:x}",
            std::process::id(),
            chrono::Utc::now().timestamp_micros()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
