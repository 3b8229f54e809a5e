//! What the primary thread does when a configuration's files change: load it anew, or keep the
//! one in force and say why.

use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::config_files::Reload;
use crate::metrics::Metrics;
use crate::rlqs::RlqsState;
use crate::rls::RlsState;

/// Reloads the rate limit configuration when its files change, counting each load.
pub(crate) fn watch_rls_config(rls: &Arc<RlsState>, metrics: &Arc<Metrics>) -> JoinHandle<()> {
    metrics.rls().config_load(true);
    let metrics = Arc::clone(metrics);
    let weak = Arc::downgrade(rls);
    rls.config.keep_watching(rls.poll, move |reload| match reload {
        Reload::Loaded => {
            if let Some(rls) = weak.upgrade() {
                // Remembered denials may not hold under the new limits.
                rls.cache.clear();
            }
            metrics.rls().config_load(true);
            tracing::info!("rate limit configuration reloaded");
        }
        Reload::Failed(e) => {
            metrics.rls().config_load(false);
            tracing::error!(error = %e, "rate limit configuration not reloaded; the previous one stays in force");
        }
        Reload::Refused(dropped) => {
            metrics.rls().config_load(false);
            tracing::error!(error = %dropped, "rate limit configuration not reloaded; the previous one stays in force");
        }
        Reload::Unchanged => {}
    })
}

/// Reloads the quota configuration when its files change; streams take the new one at their
/// next report.
pub(crate) fn watch_rlqs_config(rlqs: &Arc<RlqsState>) -> JoinHandle<()> {
    rlqs.config.keep_watching(rlqs.poll, move |reload| match reload {
        Reload::Loaded => tracing::info!("quota configuration reloaded"),
        Reload::Failed(e) => {
            tracing::error!(error = %e, "quota configuration not reloaded; the previous one stays in force");
        }
        Reload::Refused(dropped) => {
            tracing::error!(error = %dropped, "quota configuration not reloaded; the previous one stays in force");
        }
        Reload::Unchanged => {}
    })
}
