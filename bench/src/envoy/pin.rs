//! Envoy on a core of its own while the setups take turns: the load generator, sluice-server
//! and Redis on the others, so that they do not take turns with Envoy's worker on one core.
//! With the cores shared, the same listener's CPU a request swung by a tenth from one turn to
//! the next; pinned, less.

use std::process::Command;

use anyhow::{Context, bail};

/// Processes pinned for as long as it lives; they may run on every core again after.
pub struct Pinned {
    others: Vec<u32>,
    every_core: String,
}

impl Pinned {
    /// Pins `envoy` to the last core and `others` to the rest; does nothing on one core.
    pub fn new(envoy: u32, others: Vec<u32>) -> anyhow::Result<Pinned> {
        let cores = std::thread::available_parallelism()?.get();
        let every_core = format!("0-{}", cores - 1);
        if cores > 1 {
            pin(envoy, &(cores - 1).to_string())?;
            let rest = format!("0-{}", cores - 2);
            for &pid in &others {
                pin(pid, &rest)?;
            }
        }
        Ok(Pinned { others, every_core })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for &pid in &self.others {
            if let Err(e) = pin(pid, &self.every_core) {
                eprintln!("envoy: process {pid} stays pinned: {e:#}");
            }
        }
    }
}

/// Every thread of `pid` to `cores` (a list as `taskset -c` takes it).
fn pin(pid: u32, cores: &str) -> anyhow::Result<()> {
    let status = Command::new("taskset")
        .args([
            "--all-tasks",
            "--pid",
            "--cpu-list",
            cores,
            &pid.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .status()
        .context("running taskset (util-linux)")?;
    if !status.success() {
        bail!("taskset could not pin process {pid} to cores {cores}: {status}");
    }
    Ok(())
}
