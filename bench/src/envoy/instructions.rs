//! Envoy's instructions a request under callgrind, setup by setup: a count that repeats to a
//! few hundred instructions from run to run, where CPU time on this machine swings by 20 %, so
//! the module's two cost bars can be judged on it (`scripts/envoy-instructions.sh` counts).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use sluice_harness::module_dir;

use super::config::{self, Addresses, Wasm};
use super::plan::Count;
use super::setup::Setup;

/// The setups counted: the module's two bars' setups and their baselines, the floors under
/// them, and the .wasm's beside its own no-op filter.
pub const COUNTED: [Setup; 11] = [
    Setup::NoFilter,
    Setup::NoopModule,
    Setup::FloorModule,
    Setup::LocalRatelimit,
    Setup::CalloutFloorModule,
    Setup::SluiceModule,
    Setup::SluiceModuleLease,
    Setup::NativeGrpc,
    Setup::Noop,
    Setup::Sluice,
    Setup::SluiceLease,
];

/// The setups of the lease bar counted again on [`COUNTED_HOT_KEYS`] keys, interleaved, as the
/// CPU rounds run the hot keys: a key's requests seldom follow one another there, and a module
/// may keep what the last request of a key left (sluice's repeats a leased decision).
pub const COUNTED_ON_HOT_KEYS: [Setup; 4] = [
    Setup::NoFilter,
    Setup::NoopModule,
    Setup::FloorModule,
    Setup::SluiceModuleLease,
];

/// How many keys the lease bar's setups are counted on again, their requests interleaved:
/// as many as callgrind's pace keeps hot. A leased key's purse goes back to its allowance
/// once unused for a tick (100 ms at most), and a hot key at full speed is used a hundred
/// times a tick; under callgrind Envoy serves 70 to 140 requests a second, so the rounds' 10
/// keys came each about once a tick, their purses went back between requests and were
/// filled again, and the module's own count rose as the pace fell (on 10 keys, purse fills
/// for 5 % of the requests at 111 a second, 38 % at 73; the module's code 1,574 and 2,229
/// instructions a request). Three keys come each at least twice a tick at 70 a second.
pub const COUNTED_HOT_KEYS: usize = 3;

/// The lease of the lease setups when counted: [`super::setup::LEASE`]'s horizon forty times
/// over, as callgrind serves requests about a hundred times slower than Envoy at full speed.
/// A key's grant is its traffic over the horizon, so that at 500 ms a hot key's lease under
/// callgrind held a few units, its purse refilled every few requests and its renewals (each a
/// new `remaining`, which a repeated decision must match) came every few dozen: work the
/// rounds at full speed do once in hundreds of requests.
pub const COUNTED_LEASE: &str = r#"{"horizon": "20s"}"#;

/// `setup`'s name as counted: a lease setup's with [`COUNTED_LEASE`].
pub fn counted_name(setup: Setup) -> String {
    setup.name_leasing(COUNTED_LEASE)
}

/// Requests counted in each setup, after the script's warm-up of 500. Twice as many did not
/// steady the counts from round to round (docs/performance-log.md, "Tried, and not kept"):
/// what moves them is Envoy's work a request, not its work once a count.
pub const REQUESTS: u64 = 2000;

/// Times each setup is counted, a round at a time: a count moves by a few hundred
/// instructions from run to run (Envoy's own share, the lease tick's), as much as a bar's
/// margin, so a bar is judged round by round, as CPU time is.
pub const ROUNDS: usize = 3;

/// Counts `setup` in an Envoy under callgrind, one worker, its requests cycling through
/// `keys` keys (`key-0` alone for 1), its listeners and sluice-server at `addresses`, in round
/// `round`.
pub fn count(
    addresses: &Addresses,
    wasm: &Wasm<'_>,
    setup: Setup,
    keys: usize,
    round: usize,
) -> anyhow::Result<Count> {
    let dir = tempfile::tempdir()?;
    let yaml = dir.path().join("envoy.yaml");
    std::fs::write(
        &yaml,
        config::envoy_yaml_leasing(setup, addresses, wasm, COUNTED_LEASE)?,
    )?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/envoy-instructions.sh");
    let venv_bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(venv_bin).chain(std::env::split_paths(&path)))?;
    let url = format!("http://{}/", addresses.ingress);
    let mut command = Command::new("bash");
    // `KEEP=DIR`: each count's callgrind files in DIR/<setup>/<round>, for
    // `callgrind_annotate`.
    if let Some(keep) = std::env::var_os("KEEP") {
        let dir = Path::new(&keep)
            .join(format!("{}-{keys}", setup.id()))
            .join((round + 1).to_string());
        command.env("KEEP", dir);
    }
    // The script appends `-0`, `-1`, ... to the value of a header it cycles.
    let header = if keys > 1 {
        "x-api-key: key"
    } else {
        "x-api-key: key-0"
    };
    let output = command
        .arg(&script)
        .arg(&yaml)
        .arg(&url)
        .arg(REQUESTS.to_string())
        .arg(header)
        .arg(keys.to_string())
        .env("PATH", path)
        .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", module_dir())
        .output()
        .context("running scripts/envoy-instructions.sh")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "scripts/envoy-instructions.sh failed for {} ({}): {}{}",
            counted_name(setup),
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let per_request = |thread: &str| {
        read_count(&stdout, thread).with_context(|| {
            format!(
                "scripts/envoy-instructions.sh printed no `{thread}:` count for {}: {stdout}",
                counted_name(setup)
            )
        })
    };
    Ok(Count {
        setup,
        round,
        keys,
        worker: per_request("worker")?,
        main: per_request("main")?,
    })
}

/// The count on the script's line `THREAD: N instructions a request`.
fn read_count(output: &str, thread: &str) -> Option<u64> {
    output.lines().find_map(|line| {
        let rest = line.strip_prefix(thread)?.strip_prefix(": ")?;
        rest.strip_suffix(" instructions a request")?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::read_count;

    #[test]
    fn each_threads_count_is_read_from_its_own_line() {
        let output = "worker: 255177 instructions a request\nmain: 1358 instructions a request\nprocess: 256600 instructions a request\n";
        assert_eq!(read_count(output, "worker"), Some(255_177));
        assert_eq!(read_count(output, "main"), Some(1_358));
        assert_eq!(read_count(output, "process"), Some(256_600));
        assert_eq!(
            read_count("worker: many instructions a request", "worker"),
            None
        );
        assert_eq!(read_count(output, "other"), None);
    }
}
