//! Waiting for a started process to reach a state.

use crate::error::HarnessError;

/// Polls `done` every 50 ms until it says true, for at most `within`; `what` names the state
/// waited for in the error.
pub(crate) fn wait_until(
    what: &str,
    within: std::time::Duration,
    mut done: impl FnMut() -> Result<bool, HarnessError>,
) -> Result<(), HarnessError> {
    let started = std::time::Instant::now();
    loop {
        if done()? {
            return Ok(());
        }
        if started.elapsed() > within {
            return Err(HarnessError::Cluster(format!("never got to: {what}")));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
