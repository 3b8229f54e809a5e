//! Running the scripts: by `FCALL` while the server's Redis Functions library is loaded, by
//! `EVALSHA` (loading the script on `NOSCRIPT`) where Functions are refused or missing.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sluice_core::verdict::Verdict;

use super::{Backend, Store, StoreError, Topology, load_library, query};
use crate::clock;
use crate::scripts::{BatchCall, LeaseCall, LeaseReply, LimitScript, ScriptCall, decode_reply};

impl Store {
    /// Whether every key of a request may go to one script call: true but on a Cluster, where
    /// a request's keys live on different nodes.
    pub fn runs_batches(&self) -> bool {
        !matches!(self.topology, Topology::Cluster(_))
    }

    /// Runs one script call, loading the script if Redis does not have it.
    pub async fn run(self: &Arc<Self>, call: &ScriptCall) -> Result<Verdict, StoreError> {
        let reply = self
            .invoke(call.script(), std::slice::from_ref(&call.key), &call.args())
            .await?;
        Ok(decode_reply(&reply)?)
    }

    /// Runs lease asks in one call of the lease script.
    pub async fn run_lease(self: &Arc<Self>, call: &LeaseCall) -> Result<LeaseReply, StoreError> {
        let reply = self.invoke(call.script(), &call.keys, &call.args).await?;
        Ok(call.decode(&reply)?)
    }

    /// Runs several checks in one call of the batch script.
    pub async fn run_batch(self: &Arc<Self>, call: &BatchCall) -> Result<Vec<Verdict>, StoreError> {
        let reply = self.invoke(call.script(), &call.keys, &call.args).await?;
        Ok(call.decode(&reply)?)
    }

    /// `FCALL`, and on a missing function `FUNCTION LOAD` and again; or `EVALSHA`, and on
    /// `NOSCRIPT` `SCRIPT LOAD` and again (redis::Script knows that dance).
    async fn invoke(
        self: &Arc<Self>,
        script: &LimitScript,
        keys: &[String],
        args: &[impl redis::ToRedisArgs + Sync],
    ) -> Result<redis::Value, StoreError> {
        let backend = self.backend().await?;
        let key = keys.first().map(String::as_bytes);
        self.within_timeout(key, async {
            if !self.eval_only.load(Ordering::Relaxed) {
                let fcall = script.fcall(keys, args);
                match query(backend.clone(), &fcall).await {
                    Err(e) if is_function_missing(&e) => {
                        match load_library(backend.clone()).await {
                            Ok(()) => return query(backend, &fcall).await,
                            Err(e) => self.functions_failed(&e),
                        }
                    }
                    Err(e) if refuses_functions(&e) => self.functions_failed(&e),
                    answered => return answered,
                }
            }
            let invocation = script.evalsha(keys, args);
            match backend {
                Backend::Single(mut c) => invocation.invoke_async(&mut c).await,
                Backend::Cluster(mut c) => invocation.invoke_async(&mut c).await,
            }
        })
        .await
    }

    /// After `FUNCTION LOAD` or `FCALL` failed with `error`: for good, by `EVALSHA` from now on,
    /// if Redis has no Functions or refuses them; else this call alone.
    pub(super) fn functions_failed(&self, error: &redis::RedisError) {
        if refuses_functions(error) {
            if !self.eval_only.swap(true, Ordering::Relaxed) {
                tracing::warn!(%error, "Redis will not run sluice's functions library; scripts are called by EVALSHA");
            }
        } else {
            // Every call that misses the library meets this while it lasts (a Cluster primary
            // down, say): say so once in a while, not once a call.
            if let Some(left_out) = self.load_warning.due(clock::monotonic()) {
                tracing::warn!(%error, left_out, "loading the functions library failed; calls that miss it go by EVALSHA until it loads");
            }
        }
    }

    /// Whether scripts are called as functions (until Redis shows it will not run them).
    pub fn calls_functions(&self) -> bool {
        !self.eval_only.load(Ordering::Relaxed)
    }
}

/// Redis' answer to `FCALL` of a function it does not have.
fn is_function_missing(error: &redis::RedisError) -> bool {
    error.code() == Some("ERR") && error.detail() == Some("Function not found")
}

/// Redis without Functions (before 7.0: `FUNCTION` and `FCALL` are unknown commands), or an ACL
/// that forbids them.
fn refuses_functions(error: &redis::RedisError) -> bool {
    error.code() == Some("NOPERM")
        || (error.code() == Some("ERR")
            && error
                .detail()
                .is_some_and(|d| d.starts_with("unknown command")))
}
