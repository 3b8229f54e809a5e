//! Reaching a Redis that wants a password, TLS, or both: standalone, behind Sentinel and in a
//! Cluster, with the `sluice-server` binary as users start it; secrets never reach the logs.
//! And the least ACL docs/redis.md gives, on each of the three.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::Http;
use common::process::{BINARY, ServerProcess, assert_refused, decide_once};
use sluice_core::limit::Algorithm;
use sluice_harness::{MASTER_NAME, RedisCluster, RedisSentinel, RedisServer, TlsFiles, free_port};
use sluice_server::store::{Credentials, ScriptCalls, Topology};

/// Starts the binary at `--log debug`, set up further by `configure`; it must become ready and
/// decide. What it logged.
async fn decides(configure: impl FnOnce(&mut Command) -> &mut Command) -> Vec<String> {
    let mut command = Command::new(BINARY);
    command.args(["--listen", "127.0.0.1:0", "--log", "debug"]);
    let mut child = ServerProcess::start(configure(&mut command));
    let port = child.port().await;
    let answer = decide_once(port).await;
    let lines = child.stop().await;
    assert_eq!(answer.status, 200, "{}\n{lines:#?}", answer.body);
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_redis_url_authenticates_and_never_reaches_the_logs() {
    let redis = RedisServer::start().unwrap();
    redis
        .cli(&["CONFIG", "SET", "requirepass", "hunter2"])
        .unwrap();
    let lines = decides(|command| {
        command.args([
            "--redis",
            &format!("redis://:hunter2@127.0.0.1:{}", redis.port()),
        ])
    })
    .await;
    assert!(
        lines.iter().any(|l| l.contains(":***@127.0.0.1")),
        "the topology is logged: {lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("hunter2")), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_given_apart_from_the_url_authenticates_as_its_user() {
    let redis = RedisServer::start().unwrap();
    redis
        .cli(&["ACL", "SETUSER", "limiter", "on", ">hunter2", "~*", "+@all"])
        .unwrap();
    redis
        .cli(&["CONFIG", "SET", "requirepass", "other"])
        .unwrap();
    let lines = decides(|command| {
        command
            .args(["--redis", &redis.url()])
            .env("SLUICE_REDIS_USERNAME", "limiter")
            .env("SLUICE_REDIS_PASSWORD", "hunter2")
    })
    .await;
    // `default` would not have been let in with that password.
    assert!(!lines.iter().any(|l| l.contains("hunter2")), "{lines:?}");
}

/// A certificate authority, a certificate for Redis on 127.0.0.1 and one for its client, each
/// a PEM file (`ca.crt`, `redis.crt` and `redis.key`, `client.crt` and `client.key`) in the
/// directory it keeps.
struct Certificates(tempfile::TempDir);

impl Certificates {
    fn make() -> Certificates {
        let dir = tempfile::tempdir().unwrap();
        let issued: [(&str, &[&str]); 2] = [("redis", &["127.0.0.1"]), ("client", &["sluice"])];
        common::certs::make_certificates(dir.path(), "ca", &issued);
        Certificates(dir)
    }

    fn path(&self, file: &str) -> String {
        self.0.path().join(file).display().to_string()
    }

    /// A Redis answering TLS on the port it returns, verifying its clients (Redis' default),
    /// and plain TCP on its usual port; `extra_args` as well.
    fn redis(&self, extra_args: &[&str]) -> (RedisServer, u16) {
        let port = free_port().unwrap();
        let mut args = vec!["--tls-port".to_owned(), port.to_string()];
        args.extend(self.redis_files().server_args());
        args.extend(extra_args.iter().map(|arg| (*arg).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (RedisServer::start_with(&args).unwrap(), port)
    }

    /// Redis' certificate and the authority it trusts its clients' by.
    fn redis_files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.0.path().join("redis.crt"),
            key: self.0.path().join("redis.key"),
            ca: self.0.path().join("ca.crt"),
        }
    }

    /// The flags that make the server trust the authority and present its certificate.
    fn server_flags(&self) -> [String; 6] {
        [
            "--redis-ca-cert".to_owned(),
            self.path("ca.crt"),
            "--redis-client-cert".to_owned(),
            self.path("client.crt"),
            "--redis-client-key".to_owned(),
            self.path("client.key"),
        ]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_it_trusts_the_authority_given_and_presents_its_certificate() {
    let certificates = Certificates::make();
    let (redis, tls_port) = certificates.redis(&[]);
    decides(|command| {
        command
            .args(["--redis", &format!("rediss://127.0.0.1:{tls_port}")])
            .args(certificates.server_flags())
    })
    .await;
    // The decision's key is in the Redis behind the TLS port.
    let keys = redis.cli(&["--scan"]).unwrap();
    assert!(keys.contains("sluice:"), "keys: {keys}");

    // Without its certificate the server is refused, and not ready.
    let mut child = ServerProcess::start(
        Command::new(BINARY)
            .args(["--listen", "127.0.0.1:0"])
            .args(["--redis", &format!("rediss://127.0.0.1:{tls_port}")])
            .args(["--redis-ca-cert", &certificates.path("ca.crt")]),
    );
    let port = child.port().await;
    let http = Http::http1();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(answer) = http
            .try_send("GET", &format!("http://127.0.0.1:{port}/readyz"), &[], "")
            .await
        {
            statuses.push(answer.status);
        }
    }
    let lines = child.stop().await;
    assert!(
        !statuses.is_empty() && statuses.iter().all(|s| *s == 503),
        "{statuses:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("redis not usable")),
        "{lines:?}"
    );
}

#[test]
fn tls_settings_are_checked_at_start_up() {
    let certificates = Certificates::make();
    let ca = certificates.path("ca.crt");
    let key = certificates.path("client.key");
    let tls = ["--redis", "rediss://127.0.0.1:6379"];
    assert_refused(
        &["--redis", "redis://127.0.0.1:6379", "--redis-ca-cert", &ca],
        "--redis-ca-cert: certificates for TLS, but --redis gives no rediss:// URL",
    );
    assert_refused(
        &[&tls[..], &["--redis-ca-cert", &key]].concat(),
        &format!("--redis-ca-cert: {key}: no PEM certificate in it"),
    );
    let missing = certificates.path("nothing.crt");
    assert_refused(
        &[&tls[..], &["--redis-ca-cert", &missing]].concat(),
        &format!("--redis-ca-cert: {missing}: "),
    );
    let client_cert = certificates.path("client.crt");
    assert_refused(
        &[
            &tls[..],
            &[
                "--redis-client-cert",
                &client_cert,
                "--redis-client-key",
                &ca,
            ],
        ]
        .concat(),
        &format!("--redis-client-key: {ca}: "),
    );
}

#[test]
fn passwords_sentinels_and_cluster_nodes_are_checked_at_start_up() {
    assert_refused(
        &[
            "--redis",
            "redis://:hunter2@127.0.0.1:6379",
            "--redis-password",
            "hunter2",
        ],
        "--redis-password: --redis gives a password too; give it in one place",
    );
    assert_refused(
        &[
            "--redis-cluster",
            "redis://:hunter2@127.0.0.1:7000",
            "--redis-password",
            "x",
        ],
        "--redis-password: --redis-cluster gives a password too",
    );
    assert_refused(&["--redis-username", "limiter"], "--redis-password");
    assert_refused(&["--redis-password", ""], "--redis-password: empty");
    // The sentinels, and a Cluster's nodes, must be reached alike. A Cluster's that were not
    // the client refused only on connecting: the server ran unready, logging "redis
    // unreachable" every 2 s, for good.
    let unalike = [
        (
            "--redis-sentinel",
            "redis://127.0.0.1:26379,rediss://127.0.0.1:26380",
            "--redis-sentinel: `rediss://127.0.0.1:26380` is reached otherwise than \
             `redis://127.0.0.1:26379`",
        ),
        (
            "--redis-sentinel",
            "redis://:hunter2@127.0.0.1:26379,redis://127.0.0.1:26380",
            "--redis-sentinel: `redis://127.0.0.1:26380` is reached otherwise than \
             `redis://:***@127.0.0.1:26379`",
        ),
        (
            "--redis-sentinel",
            "redis://127.0.0.1:26379/2,redis://127.0.0.1:26380",
            "--redis-sentinel: `redis://127.0.0.1:26380` is reached otherwise than \
             `redis://127.0.0.1:26379/2`",
        ),
        (
            "--redis-cluster",
            "redis://:hunter2@127.0.0.1:7000,redis://:hunter3@127.0.0.1:7001",
            "--redis-cluster: `redis://:***@127.0.0.1:7001` is reached otherwise than \
             `redis://:***@127.0.0.1:7000`: every node takes the same scheme",
        ),
        (
            "--redis-cluster",
            "rediss://127.0.0.1:7000,redis://127.0.0.1:7001",
            "--redis-cluster: `redis://127.0.0.1:7001` is reached otherwise than \
             `rediss://127.0.0.1:7000`",
        ),
        (
            "--redis-cluster",
            "redis://127.0.0.1:7000,unix:///run/redis.sock",
            "--redis-cluster: `unix:///run/redis.sock` is a Unix socket",
        ),
    ];
    for (flag, urls, expected) in unalike {
        let mut args = vec![flag, urls];
        if flag == "--redis-sentinel" {
            args.extend(["--sentinel-master", MASTER_NAME]);
        }
        assert_refused(&args, expected);
    }
}

/// A db number in the sentinels' URLs is the primary's: a sentinel has none of its own, and
/// the limits must not land in db 0 of a Redis shared by db.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_the_db_number_of_the_sentinel_urls_is_the_primarys() {
    let sentinel = RedisSentinel::start().unwrap();
    let running = common::server(
        Topology::Sentinel {
            sentinels: vec![format!("{}/3", sentinel.sentinel_url())],
            master: MASTER_NAME.to_owned(),
        },
        |_| {},
    )
    .await;
    let body = common::one_check(
        "db",
        "k",
        r#"{"algorithm":"gcra","rate":10,"per":"1s","burst":5}"#,
    );
    let answer = Http::http1().decide(&running.url(), &body, &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let keys = |db: &str| {
        sentinel
            .primary
            .cli(&["-n", db, "KEYS", "sluice:*"])
            .unwrap()
    };
    assert!(keys("3").contains("sluice:"), "db 3 holds {:?}", keys("3"));
    assert_eq!(keys("0").trim(), "", "db 0 holds keys");
}

const PRIMARY_PASSWORD: &str = "primary-secret";
const SENTINEL_PASSWORD: &str = "sentinel-secret";

/// A primary that wants [`PRIMARY_PASSWORD`] and a sentinel watching it that wants
/// [`SENTINEL_PASSWORD`]; with `certificates`, both over TLS (the sentinel naming the primary's
/// TLS port). Each keeps a plain port for the harness.
struct GuardedSentinel {
    primary: RedisServer,
    _sentinel: RedisServer,
    /// How the server reaches the sentinel.
    url: String,
}

impl GuardedSentinel {
    fn start(certificates: Option<&Certificates>) -> GuardedSentinel {
        let guarded = ["--requirepass", PRIMARY_PASSWORD];
        let (primary, primary_port, sentinel_tls) = match certificates {
            Some(certificates) => {
                let (primary, tls_port) = certificates.redis(&guarded);
                (primary, tls_port, Some(free_port().unwrap()))
            }
            None => {
                let primary = RedisServer::start_with(&guarded).unwrap();
                let port = primary.port();
                (primary, port, None)
            }
        };
        let dir = tempfile::tempdir().unwrap();
        let port = free_port().unwrap();
        let mut config = format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nrequirepass {SENTINEL_PASSWORD}\n",
            dir.path().display()
        );
        if let (Some(certificates), Some(tls_port)) = (certificates, sentinel_tls) {
            config.push_str(&format!("tls-port {tls_port}\ntls-replication yes\n"));
            // A configuration file takes redis-server's flags as lines, without the dashes.
            for setting in certificates.redis_files().server_args().chunks(2) {
                config.push_str(&format!("{} {}\n", &setting[0][2..], setting[1]));
            }
        }
        config.push_str(&format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 1\n\
             sentinel auth-pass {MASTER_NAME} {PRIMARY_PASSWORD}\n"
        ));
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, config).unwrap();
        let sentinel = RedisServer::start_config(dir, port, &path, &["--sentinel"]).unwrap();
        let url = match sentinel_tls {
            Some(tls_port) => format!("rediss://:{SENTINEL_PASSWORD}@127.0.0.1:{tls_port}"),
            None => format!("redis://:{SENTINEL_PASSWORD}@127.0.0.1:{port}"),
        };
        GuardedSentinel {
            primary,
            _sentinel: sentinel,
            url,
        }
    }

    /// The keys the primary holds.
    fn keys(&self) -> String {
        self.primary
            .cli(&["--pass", PRIMARY_PASSWORD, "--no-auth-warning", "--scan"])
            .unwrap()
    }
}

/// Starts the binary behind a [`GuardedSentinel`] (over TLS with `certificates`), the
/// primary's password in `SLUICE_REDIS_PASSWORD`: it must decide, the key land in the
/// primary, and neither password reach its logs.
async fn assert_decides_behind_sentinel(certificates: Option<&Certificates>) {
    let sentinel = GuardedSentinel::start(certificates);
    let lines = decides(|command| {
        command
            .args(["--redis-sentinel", &sentinel.url])
            .args(["--sentinel-master", MASTER_NAME])
            .env("SLUICE_REDIS_PASSWORD", PRIMARY_PASSWORD)
            .args(
                certificates
                    .map(Certificates::server_flags)
                    .into_iter()
                    .flatten(),
            )
    })
    .await;
    let keys = sentinel.keys();
    assert!(keys.contains("sluice:"), "the primary holds {keys}");
    for secret in [PRIMARY_PASSWORD, SENTINEL_PASSWORD] {
        assert!(!lines.iter().any(|l| l.contains(secret)), "{lines:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_it_logs_in_to_the_sentinel_and_to_the_primary_apart() {
    assert_decides_behind_sentinel(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_over_tls_it_reaches_the_primary_over_tls_too() {
    assert_decides_behind_sentinel(Some(&Certificates::make())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_with_a_password_is_reached_on_every_node() {
    let certificates = Certificates::make();
    let cluster = RedisCluster::start_tls(&certificates.redis_files()).unwrap();
    for node in cluster.nodes() {
        for setting in ["masterauth", "requirepass"] {
            node.cli(&["CONFIG", "SET", setting, PRIMARY_PASSWORD])
                .unwrap();
        }
    }
    let mut child = ServerProcess::start(
        Command::new(BINARY)
            .args(["--listen", "127.0.0.1:0", "--log", "debug"])
            // One node given: the client learns the others, and their TLS ports, from it.
            .args(["--redis-cluster", &cluster.tls_urls()[0]])
            .args(certificates.server_flags())
            .env("SLUICE_REDIS_PASSWORD", PRIMARY_PASSWORD),
    );
    let port = child.port().await;
    let url = format!("http://127.0.0.1:{port}");
    decide_once(port).await;
    // Keys that hash to every node's slots, each decided there.
    let http = Http::http1();
    let limit = r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":1}"#;
    for client in 0..30 {
        let answer = http
            .decide(
                &url,
                &common::one_check("r", &format!("c{client}"), limit),
                &[],
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let lines = child.stop().await;
    assert!(
        !lines.iter().any(|l| l.contains(PRIMARY_PASSWORD)),
        "{lines:#?}"
    );
    for node in cluster.nodes() {
        let keys = node
            .cli(&["--pass", PRIMARY_PASSWORD, "--no-auth-warning", "DBSIZE"])
            .unwrap();
        let keys: u64 = keys
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("DBSIZE said {keys}"));
        assert!(keys > 0, "no key on node {}", node.port());
    }
}

/// Every path of every script through `server`, each answered 200: each algorithm alone past
/// its limit with denials counted (a sliding log trims its oldest units, part of an entry
/// among them), two in one call,
/// and a lease taken and dropped (the ledger deleted), then taken and given back.
async fn decide_everything(server: &str) {
    let http = Http::http1();
    let post = |path: &str, body: String| {
        let url = format!("{server}{path}");
        let http = http.clone();
        async move {
            http.send("POST", &url, &[("content-type", "application/json")], body)
                .await
        }
    };
    for algorithm in Algorithm::ALL {
        let limit = match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => {
                format!(r#"{{"algorithm":"{algorithm}","limit":3,"window":"1m"}}"#)
            }
            _ => format!(r#"{{"algorithm":"{algorithm}","rate":1,"per":"1m","burst":3}}"#),
        };
        let counted = |cost: u64| {
            format!(
                r#"{{"checks":[{{"rule":"one","key":"k","limit":{limit},"count_denied":true,"cost":{cost}}}]}}"#
            )
        };
        let two = format!(
            r#"{{"checks":[{{"rule":"a","key":"k","limit":{limit}}},{{"rule":"b","key":"k","limit":{limit}}}]}}"#
        );
        // The first takes the whole limit as one entry, which the counted denials after it
        // then trim part of.
        let bodies = std::iter::once(counted(3)).chain(std::iter::repeat_n(counted(1), 7));
        for body in bodies.chain([two]) {
            let answer = post("/v1/decide", body).await;
            assert_eq!(answer.status, 200, "{algorithm}: {}", answer.body);
        }
        for (want, held, returning) in [(1, 0, 0), (0, 0, 0), (1, 0, 0), (0, 0, 1)] {
            let ask = format!(
                r#"{{"holder":"h","asks":[{{"rule":"l","key":"k","limit":{limit},"terms":{{"max_units":2,"max_outstanding":4,"ttl":"1s"}},"want":{want},"held":{held},"returning":{returning}}}]}}"#
            );
            let answer = post("/v1/lease", ask).await;
            assert_eq!(answer.status, 200, "{algorithm}: {}", answer.body);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_is_all_the_server_needs() {
    let redis = RedisServer::start().unwrap();
    let url = user_with_documented_acl(&redis, "acl");
    assert_acl_is_enough(
        Topology::Standalone(url),
        Credentials::default(),
        std::slice::from_ref(&redis),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_documented_acl_is_all_the_server_needs() {
    let cluster = RedisCluster::start().unwrap();
    let urls = cluster
        .nodes()
        .iter()
        .map(|node| user_with_documented_acl(node, "acl-cluster"))
        .collect();
    assert_acl_is_enough(
        Topology::Cluster(urls),
        Credentials::default(),
        cluster.nodes(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_the_documented_acl_is_all_the_server_needs() {
    let sentinel = RedisSentinel::start().unwrap();
    user_with_documented_acl(&sentinel.primary, "acl-sentinel");
    let topology = Topology::Sentinel {
        sentinels: vec![sentinel.sentinel_url()],
        master: MASTER_NAME.to_owned(),
    };
    let login = Credentials {
        username: Some("limiter".to_owned()),
        password: Some("hunter2".to_owned()),
        tls: None,
    };
    assert_acl_is_enough(topology, login, std::slice::from_ref(&sentinel.primary)).await;
}

/// Makes the user `limiter` (password `hunter2`) on `redis` with the rules of docs/redis.md's
/// ```acl block, and those of the block `extra` names too; its URL.
pub(crate) fn user_with_documented_acl(redis: &RedisServer, extra: &str) -> String {
    let rules: Vec<String> = ["acl", extra]
        .into_iter()
        .flat_map(documented_acl)
        .collect();
    let mut setuser = vec!["ACL", "SETUSER", "limiter", "on", ">hunter2"];
    setuser.extend(rules.iter().map(String::as_str));
    let said = redis.cli(&setuser).unwrap();
    assert_eq!(said.trim(), "OK", "{setuser:?}");
    format!("redis://limiter:hunter2@127.0.0.1:{}", redis.port())
}

/// A server at `topology`, with Functions and then by `EVALSHA`, decides everything, and none
/// of `nodes` refused it a command or a key.
async fn assert_acl_is_enough(topology: Topology, login: Credentials, nodes: &[RedisServer]) {
    for calls in [ScriptCalls::Functions, ScriptCalls::Eval] {
        let server = common::server(topology.clone(), |c| {
            c.script_calls = calls;
            c.redis_credentials = login.clone();
        })
        .await;
        decide_everything(&server.url()).await;
    }
    for node in nodes {
        let log = node.cli(&["ACL", "LOG"]).unwrap();
        assert!(log.trim().is_empty(), "{} refused: {log}", node.port());
    }
    let calls = |command| {
        nodes
            .iter()
            .map(|node| common::calls(node, command))
            .sum::<u64>()
    };
    assert!(calls("fcall") > 0 && calls("evalsha") > 0, "both ways ran");
}

/// The ACL rules of docs/redis.md's code block `block` (```acl, ```acl-cluster, ...).
fn documented_acl(block: &str) -> Vec<String> {
    let doc = include_str!("../../docs/redis.md");
    let rules = doc
        .split(&format!("```{block}\n"))
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_else(|| panic!("docs/redis.md has no ```{block} block"));
    rules.split_whitespace().map(str::to_owned).collect()
}
