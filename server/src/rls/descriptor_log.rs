//! Every `ShouldRateLimit` call's domain and descriptors, one JSON line each, as they came
//! (`--rls-descriptor-log`): what Envoy's route actions actually send, to check a route
//! configuration against, or to hold the simulator's model of them against a real Envoy.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use serde::Serialize;
use sluice_core::rls::request::RlsRequest;

/// One logged call.
#[derive(Debug, Serialize)]
struct Line<'a> {
    domain: &'a str,
    /// Each descriptor's (key, value) entries, as `[["key", "value"], ...]`.
    descriptors: Vec<Vec<(&'a str, &'a str)>>,
}

/// The log: written a line at a time, each flushed, so that a reader sees every call answered
/// so far.
#[derive(Debug)]
pub struct DescriptorLog {
    out: Mutex<BufWriter<File>>,
}

impl DescriptorLog {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> io::Result<DescriptorLog> {
        Ok(DescriptorLog {
            out: Mutex::new(BufWriter::new(File::create(path)?)),
        })
    }

    /// Appends `request`'s line; a write that fails is said once in the server's log and the
    /// call is still decided.
    pub fn record(&self, request: &RlsRequest) {
        let line = Line {
            domain: &request.domain,
            descriptors: request
                .descriptors
                .iter()
                .map(|d| {
                    d.entries
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect()
                })
                .collect(),
        };
        let Ok(mut out) = self.out.lock() else {
            return;
        };
        let written = serde_json::to_writer(&mut *out, &line)
            .map_err(io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if let Err(e) = written {
            tracing::warn!(error = %e, "the descriptor log could not be written");
        }
    }
}
