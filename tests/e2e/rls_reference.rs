//! The reference rate limit service's documented examples (`examples/ratelimit/`), asked of a
//! real sluice-server over real Redis by a client nobody here wrote: the Python stubs of
//! Envoy's API package (`xds-protos`), driven by `tests/e2e/rls_reference.py`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::rls::answer::RlsHeaders;
use sluice_e2e::run_stub_client;
use sluice_harness::RedisServer;
use sluice_server::ServerConfig;
use sluice_server::rls::RlsState;
use sluice_server::rls::config::WatchedConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_services_documented_examples_give_the_documented_answers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let redis = RedisServer::start().unwrap();
    let config = WatchedConfig::load(vec![root.join("examples/ratelimit")]).unwrap();
    let mut settings = ServerConfig::standalone(redis.url());
    settings.replay_time = true;
    settings.rls = Some(Arc::new(RlsState::new(
        config,
        1000,
        RlsHeaders::Reference,
        Duration::from_secs(1),
    )));
    let server = sluice_server::spawn(settings, ([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let stdout = run_stub_client(&root.join("tests/e2e/rls_reference.py"), &server).await;
    assert!(stdout.contains("11 examples ok"), "{stdout}");
    server.stop().await.unwrap();
}
