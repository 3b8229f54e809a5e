//! Where a section's chart is written: the committed charts beside BENCHMARKS.md are written
//! only by the run that writes BENCHMARKS.md, so that a partial run (`envoy --only`) or a
//! section run alone leaves them matching the figures committed with them.

use std::path::PathBuf;

/// The directory a run's charts go to, as the section's Markdown links them.
#[derive(Debug, Clone, Copy)]
pub enum ChartDir {
    /// `bench/`, beside BENCHMARKS.md: `sluice-bench all`.
    Committed,
    /// `target/bench/`, ignored by git: a section run on its own.
    Scratch,
}

impl ChartDir {
    fn dir(self) -> &'static str {
        match self {
            ChartDir::Committed => "bench",
            ChartDir::Scratch => "target/bench",
        }
    }

    /// Writes `svg` as `name` and returns its path, to link from the section.
    pub fn write(self, name: &str, svg: String) -> anyhow::Result<String> {
        std::fs::create_dir_all(self.dir())
            .map_err(|e| anyhow::anyhow!("making the charts' directory {}: {e}", self.dir()))?;
        let path: PathBuf = [self.dir(), name].iter().collect();
        std::fs::write(&path, svg)
            .map_err(|e| anyhow::anyhow!("writing the chart {}: {e}", path.display()))?;
        Ok(path.display().to_string())
    }
}
