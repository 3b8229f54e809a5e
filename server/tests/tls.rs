//! TLS on the server's own listeners (`--tls-cert`, `--tls-key`, `--tls-client-ca`,
//! `--tls-client-san`, `--tls-for`), as envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS` family
//! gives it: `/v1/decide` over HTTP/1.1 and Envoy's rate limit API over HTTP/2, each chosen by
//! ALPN, and clients refused unless their certificate is signed and named as required.

use crate::common;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use common::certs::make_certificates;
use common::one_check;
use common::process::assert_refused;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sluice_harness::RedisServer;
use sluice_server::ServerConfig;
use sluice_server::envoy_api::ratelimit::{
    Code, DescriptorEntry, RateLimitClient, RateLimitDescriptor, RateLimitRequest,
};
use sluice_server::rls::RlsState;
use sluice_server::rls::config::WatchedConfig;
use sluice_server::tls::{ListenerTls, TlsFiles, TlsFor};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

const LIMIT: &str = r#"{"algorithm":"gcra","rate":100,"per":"1s","burst":100}"#;

const RLS_CONFIG: &str = "domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 100}
";

/// An authority `ca` with the server's certificate for 127.0.0.1, `envoy`'s for
/// `envoy.example` and `other`'s for `other.example`; an authority `stranger-ca` with
/// `stranger`'s, for `envoy.example` too; and an authority `next-ca` with `next-server`'s, for
/// 127.0.0.1 too, the server's renewed. Beside them, the rate limit configuration.
fn files() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    let issued: [(&str, &[&str]); 3] = [
        ("server", &["127.0.0.1"]),
        ("envoy", &["envoy.example"]),
        ("other", &["other.example"]),
    ];
    make_certificates(dir.path(), "ca", &issued);
    make_certificates(
        dir.path(),
        "stranger-ca",
        &[("stranger", &["envoy.example"])],
    );
    make_certificates(dir.path(), "next-ca", &[("next-server", &["127.0.0.1"])]);
    std::fs::write(dir.path().join("edge.yaml"), RLS_CONFIG).unwrap();
    dir
}

/// The server's TLS, from `files`, with `client_ca` and `client_san` as given.
fn listener_tls(
    files: &TempDir,
    client_ca: Option<&str>,
    client_san: Option<&str>,
    on: TlsFor,
) -> ListenerTls {
    let path = |name: &str| files.path().join(name);
    let client_ca = client_ca.map(path);
    ListenerTls::from_files(
        TlsFiles {
            cert: &path("server.crt"),
            key: &path("server.key"),
            client_ca: client_ca.as_deref(),
            client_san,
        },
        on,
    )
    .unwrap()
}

/// A server with `tls`, and the addresses of its listeners.
struct TlsServer {
    listen: SocketAddr,
    /// The gRPC API's own, or `listen` where it has none.
    grpc: SocketAddr,
    _redis: RedisServer,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// A server with `tls`, its gRPC API on a listener of its own if `grpc_apart`.
async fn start(files: &TempDir, tls: ListenerTls, grpc_apart: bool) -> TlsServer {
    let redis = RedisServer::start().unwrap();
    let mut config = ServerConfig::standalone(redis.url());
    let rls = WatchedConfig::load(vec![files.path().join("edge.yaml")]).unwrap();
    config.rls = Some(Arc::new(RlsState::new(
        rls,
        0,
        Default::default(),
        std::time::Duration::from_secs(1),
    )));
    config.tls = Some(tls);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listen = listener.local_addr().unwrap();
    let grpc_listener = match grpc_apart {
        true => Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
        false => None,
    };
    let grpc = grpc_listener
        .as_ref()
        .map_or(listen, |l| l.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(sluice_server::serve_on(
        config,
        listener,
        grpc_listener,
        async move {
            let _ = stopped.await;
        },
    ));
    TlsServer {
        listen,
        grpc,
        _redis: redis,
        _stop: stop,
    }
}

/// A client trusting `ca`, presenting `<client>.crt` if one is named, and offering `alpn`.
fn connector(files: &TempDir, client: Option<&str>, alpn: &[u8]) -> TlsConnector {
    connector_trusting(files, "ca", client, alpn)
}

/// A client trusting the authority `<authority>.crt`, and otherwise as [`connector`].
fn connector_trusting(
    files: &TempDir,
    authority: &str,
    client: Option<&str>,
    alpn: &[u8],
) -> TlsConnector {
    let read = |name: &str| std::fs::read(files.path().join(name)).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for authority in CertificateDer::pem_slice_iter(&read(&format!("{authority}.crt"))) {
        roots.add(authority.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some(client) => {
            let chain = CertificateDer::pem_slice_iter(&read(&format!("{client}.crt")))
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(&read(&format!("{client}.key"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    // Each connection a whole handshake: a session resumed would skip the certificates.
    config.resumption = rustls::client::Resumption::disabled();
    TlsConnector::from(Arc::new(config))
}

/// A TLS connection through `connector` to `addr`, which must have agreed by ALPN to the
/// protocol offered (gRPC clients such as grpc-go require it).
async fn tls_connect(
    connector: &TlsConnector,
    addr: SocketAddr,
) -> io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let stream = connector.connect(name, tcp).await?;
    let (_, session) = stream.get_ref();
    let offered = connector.config().alpn_protocols.first().map(Vec::as_slice);
    if session.alpn_protocol() != offered {
        return Err(io::Error::other(format!(
            "ALPN: {:?} agreed, {offered:?} offered",
            session.alpn_protocol()
        )));
    }
    Ok(stream)
}

/// One `/v1/decide` over HTTP/1.1 on a connection through `connector`: its status, or why
/// there was none.
async fn decide(connector: &TlsConnector, addr: SocketAddr) -> Result<u16, String> {
    // A handshake or an answer that never comes is a failure to report, not a hung test.
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        decide_unbounded(connector, addr),
    )
    .await
    .map_err(|_| "no answer within 10 s".to_owned())?
}

async fn decide_unbounded(connector: &TlsConnector, addr: SocketAddr) -> Result<u16, String> {
    let stream = tls_connect(connector, addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = http::Request::post("/v1/decide")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(one_check("r", "10.0.0.1", LIMIT))))
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok(status)
}

/// As [`decide`], once Redis answers the server: it connects in the background.
async fn decide_once_ready(connector: &TlsConnector, addr: SocketAddr) -> Result<u16, String> {
    for _ in 0..200 {
        if let Ok(200) = decide(connector, addr).await {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    decide(connector, addr).await
}

/// Opens connections for tonic through `connector`, offering h2.
#[derive(Clone)]
struct TlsConnect {
    connector: TlsConnector,
    addr: SocketAddr,
}

impl tower_service::Service<http::Uri> for TlsConnect {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(TokioIo::new(tls_connect(&this.connector, this.addr).await?)) })
    }
}

/// One `ShouldRateLimit` over HTTP/2 through `connect`: its overall code.
async fn should_rate_limit(connect: TlsConnect) -> Result<Code, String> {
    let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1")
        .connect_with_connector(connect)
        .await
        .map_err(|e| e.to_string())?;
    let mut client = RateLimitClient::new(channel);
    let request = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![DescriptorEntry {
                key: "remote_address".to_owned(),
                value: "10.0.0.1".to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    };
    let answer = client
        .should_rate_limit(request)
        .await
        .map_err(|e| e.to_string())?;
    Ok(answer.into_inner().overall_code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_decide_answers_http1_and_the_rate_limit_api_answers_h2() {
    let files = files();
    for grpc_apart in [false, true] {
        let tls = listener_tls(&files, None, None, TlsFor::All);
        let server = start(&files, tls, grpc_apart).await;
        let http1 = connector(&files, None, b"http/1.1");
        assert_eq!(decide_once_ready(&http1, server.listen).await, Ok(200));
        let connect = TlsConnect {
            connector: connector(&files, None, b"h2"),
            addr: server.grpc,
        };
        assert_eq!(
            should_rate_limit(connect).await,
            Ok(Code::Ok),
            "{grpc_apart}"
        );
    }
    let server = start(&files, listener_tls(&files, None, None, TlsFor::All), false).await;
    // Nothing is served in cleartext on a TLS listener.
    let cleartext = common::Http::http1()
        .try_send("GET", &format!("http://{}/readyz", server.listen), &[], "")
        .await;
    assert!(cleartext.is_err(), "{:?}", cleartext.map(|a| a.status));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_client_authorities_only_a_certificate_they_signed_with_the_name_required_gets_in() {
    let files = files();
    let tls = listener_tls(&files, Some("ca.crt"), Some("envoy.example"), TlsFor::All);
    let server = start(&files, tls, false).await;
    let as_client = |client| connector(&files, client, b"http/1.1");
    let envoy = as_client(Some("envoy"));
    assert_eq!(decide_once_ready(&envoy, server.listen).await, Ok(200));
    for client in [None, Some("stranger"), Some("other")] {
        let refused = decide(&as_client(client), server.listen).await;
        assert!(refused.is_err(), "{client:?} was let in: {refused:?}");
    }
    // Without a name required, any certificate the authority signed gets in.
    let tls = listener_tls(&files, Some("ca.crt"), None, TlsFor::All);
    let server = start(&files, tls, false).await;
    let other = as_client(Some("other"));
    assert_eq!(decide_once_ready(&other, server.listen).await, Ok(200));
    assert!(
        decide(&as_client(Some("stranger")), server.listen)
            .await
            .is_err()
    );
}

/// With `--tls-for grpc`, `--listen` serves probes, metrics and decisions in cleartext, and
/// counts the gRPC listener's failed handshakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_for_grpc_leaves_the_main_listener_in_cleartext() {
    let files = files();
    let server = start(&files, listener_tls(&files, None, None, TlsFor::Grpc), true).await;
    let http = common::Http::http1();
    let mut ready = http.get(&format!("http://{}/readyz", server.listen)).await;
    for _ in 0..200 {
        if ready.status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        ready = http.get(&format!("http://{}/readyz", server.listen)).await;
    }
    assert_eq!(ready.status, 200, "{}", ready.body);
    let decided = http
        .decide(
            &format!("http://{}", server.listen),
            &one_check("r", "10.0.0.1", LIMIT),
            &[],
        )
        .await;
    assert_eq!(decided.status, 200, "{}", decided.body);
    let connect = TlsConnect {
        connector: connector(&files, None, b"h2"),
        addr: server.grpc,
    };
    assert_eq!(should_rate_limit(connect).await, Ok(Code::Ok));

    // A client that does not speak TLS fails its handshake, and /metrics counts it.
    let mut cleartext = TcpStream::connect(server.grpc).await.unwrap();
    cleartext
        .write_all(b"GET /readyz HTTP/1.1\r\nhost: sluice\r\n\r\n")
        .await
        .unwrap();
    let _ = cleartext.read_to_end(&mut Vec::new()).await;
    let counted = "sluice_tls_handshake_failures_total 1\n";
    let mut metrics = String::new();
    for _ in 0..40 {
        metrics = http
            .get(&format!("http://{}/metrics", server.listen))
            .await
            .body;
        if metrics.contains(counted) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(metrics.contains(counted), "{metrics}");
}

/// A certificate renewed in place (cert-manager, a Kubernetes secret's files) is presented from
/// the next handshake on; files that do not hold a good one yet leave the last in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_renewed_in_its_files_is_presented_without_a_restart() {
    let files = files();
    let path = |name: &str| files.path().join(name);
    let renew = |from: &str, to: &str| std::fs::copy(path(from), path(to)).unwrap();
    renew("server.crt", "live.crt");
    renew("server.key", "live.key");
    let mut tls = ListenerTls::from_files(
        TlsFiles {
            cert: &path("live.crt"),
            key: &path("live.key"),
            client_ca: None,
            client_san: None,
        },
        TlsFor::All,
    )
    .unwrap();
    tls.check_files_every = std::time::Duration::from_millis(20);
    let server = start(&files, tls, false).await;
    let trusting_old = connector_trusting(&files, "ca", None, b"http/1.1");
    let trusting_new = connector_trusting(&files, "next-ca", None, b"http/1.1");
    assert_eq!(
        decide_once_ready(&trusting_old, server.listen).await,
        Ok(200)
    );
    assert!(decide(&trusting_new, server.listen).await.is_err());

    // The key first: until the certificate follows, the two do not match.
    renew("next-server.key", "live.key");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(decide(&trusting_old, server.listen).await, Ok(200));
    renew("next-server.crt", "live.crt");
    assert_eq!(
        decide_once_ready(&trusting_new, server.listen).await,
        Ok(200)
    );
    assert!(decide(&trusting_old, server.listen).await.is_err());
}

#[test]
fn tls_settings_of_the_listeners_are_checked_at_start_up() {
    let files = files();
    let path = |name: &str| files.path().join(name).display().to_string();
    let (cert, key) = (path("server.crt"), path("server.key"));
    let tls = |extra: &[&str]| {
        let mut args = vec!["--tls-cert", &cert, "--tls-key", &key];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let refused = |args: Vec<String>, expected: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_refused(&args, expected);
    };
    let missing = path("missing.crt");
    refused(
        vec![
            "--tls-cert".into(),
            missing.clone(),
            "--tls-key".into(),
            key.clone(),
        ],
        &format!("--tls-cert: {missing}: "),
    );
    let other_key = path("envoy.key");
    refused(
        vec![
            "--tls-cert".into(),
            cert.clone(),
            "--tls-key".into(),
            other_key.clone(),
        ],
        &format!("--tls-key: {other_key}: not the key of --tls-cert's certificate"),
    );
    refused(
        tls(&["--tls-client-ca", &key]),
        &format!("--tls-client-ca: {key}: no PEM certificate in it"),
    );
    let ca = path("ca.crt");
    refused(
        tls(&["--tls-client-ca", &ca, "--tls-client-san", "not a name"]),
        "--tls-client-san: `not a name` is neither a DNS name nor an IP address",
    );
    refused(
        tls(&["--tls-for", "grpc"]),
        "--tls-for: grpc puts TLS on --grpc-listen's listener alone, and none is given",
    );
    refused(
        vec!["--tls-client-san".into(), "envoy.example".into()],
        "--tls-client-ca",
    );
}
