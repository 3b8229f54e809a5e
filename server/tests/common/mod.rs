//! Shared by the server's integration tests: a real Redis and a connected store.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use sluice_core::limit::Limit;
use sluice_server::store::{Store, Topology};

/// A store connected to `topology`, waiting until Redis answers.
pub async fn connected_store(topology: Topology) -> Arc<Store> {
    let store = Store::connect(topology, Duration::from_secs(2));
    for _ in 0..200 {
        if store.ping().await.is_ok() {
            return store;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("redis never answered");
}

/// Parses a limit written as JSON.
pub fn limit(json: &str) -> Limit {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}
