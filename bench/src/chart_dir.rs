//! Where a section's chart is written: the committed charts beside BENCHMARKS.md are written
//! only by the run that writes BENCHMARKS.md, so that a partial run (`envoy --only`) or a
//! section run alone leaves them matching the figures committed with them.

use std::path::Path;

use anyhow::Context;

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
        let dir = Path::new(self.dir());
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        Ok(path.display().to_string())
    }
}
