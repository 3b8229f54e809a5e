//! sluice-server's Rate Limit Quota Service with the shipped `envoy/rlqs/` configuration,
//! spoken to by a client nobody here wrote: the Python stubs of Envoy's API package
//! (`xds-protos`), driven by `tests/e2e/rlqs_protocol.py`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_e2e::run_stub_client;
use sluice_harness::RedisServer;
use sluice_server::ServerConfig;
use sluice_server::rlqs::RlqsState;
use sluice_server::rlqs::config::WatchedConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_own_stubs_get_assignments_refusals_and_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let redis = RedisServer::start().unwrap();
    let mut settings = ServerConfig::standalone(redis.url());
    settings.rlqs = Some(Arc::new(RlqsState::new(
        WatchedConfig::load(vec![root.join("envoy/rlqs")]).unwrap(),
        Duration::from_secs(1),
    )));
    let server = sluice_server::spawn(settings, ([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let stdout = run_stub_client(&root.join("tests/e2e/rlqs_protocol.py"), &server).await;
    assert!(stdout.contains("4 checks ok"), "{stdout}");
    server.stop().await.unwrap();
}
