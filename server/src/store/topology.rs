//! Where Redis is, and what the server logs in with: checked once at start-up, written to
//! logs without secrets.

use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult, TlsCertificates};

use crate::flag_error::FlagError;

/// Where Redis is.
#[derive(Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server (`redis://host:port/db`).
    Standalone(String),
    /// A Redis Cluster, from any of its nodes.
    Cluster(Vec<String>),
    /// A primary found through Sentinel.
    Sentinel {
        /// The sentinels' URLs.
        sentinels: Vec<String>,
        /// The monitored primary's name.
        master: String,
    },
}

impl Topology {
    /// The flag that gives its URLs.
    pub fn flag(&self) -> &'static str {
        match self {
            Topology::Standalone(_) => "--redis",
            Topology::Cluster(_) => "--redis-cluster",
            Topology::Sentinel { .. } => "--redis-sentinel",
        }
    }

    /// Checks that every URL is one the Redis client connects by, and that a Cluster's nodes or
    /// the sentinels are all reached alike; the error names the URL, its password hidden.
    pub fn check(&self) -> Result<(), FlagError> {
        let refused = |reason: String| FlagError::new(self.flag(), reason);
        let urls = self.urls();
        if urls.is_empty() {
            return Err(refused("no Redis URL".to_owned()));
        }
        let mut infos = Vec::with_capacity(urls.len());
        for url in urls {
            infos.push(url.as_str().into_connection_info().map_err(|e| {
                refused(format!(
                    "`{}` is not a Redis URL: redis://[[user]:password@]host[:port][/db], \
                     rediss://… for TLS, or unix:///path ({e})",
                    redacted(url)
                ))
            })?);
        }
        // A Cluster's nodes are reached alike, and so are the sentinels: the client takes one
        // TLS setting, one login and one db number (the sentinels' is the primary's) for all of
        // them, from the first URL. A node's that differs made it fail on connecting, again and
        // again, while the server ran unready; a sentinel's was ignored.
        let what = match self {
            Topology::Standalone(_) => return Ok(()),
            Topology::Cluster(_) => "node",
            Topology::Sentinel { .. } => "sentinel",
        };
        if let Topology::Cluster(_) = self
            && let Some((url, _)) = urls
                .iter()
                .zip(&infos)
                .find(|(_, info)| matches!(info.addr(), ConnectionAddr::Unix(_)))
        {
            return Err(refused(format!(
                "`{}` is a Unix socket: a Cluster's nodes name one another by host and port, \
                 so the client reaches them over TCP",
                redacted(url)
            )));
        }
        let reach = |info: &ConnectionInfo| {
            let settings = info.redis_settings();
            (
                is_tls(info),
                settings.username().map(str::to_owned),
                settings.password().map(str::to_owned),
                settings.db(),
            )
        };
        for (url, info) in urls.iter().zip(&infos).skip(1) {
            if reach(info) != reach(&infos[0]) {
                return Err(refused(format!(
                    "`{}` is reached otherwise than `{}`: every {what} takes the same scheme \
                     (redis:// or rediss://), the same user and password, and the same db \
                     number",
                    redacted(url),
                    redacted(&urls[0])
                )));
            }
        }
        Ok(())
    }

    /// Whether a URL of a server holding the limits carries a password (a sentinel's is the
    /// sentinel's own, and does not count).
    pub fn gives_password(&self) -> bool {
        match self {
            Topology::Standalone(_) | Topology::Cluster(_) => self
                .connection_infos()
                .any(|info| info.redis_settings().password().is_some()),
            Topology::Sentinel { .. } => false,
        }
    }

    /// Whether any of its URLs asks for TLS (`rediss://`, or `valkeys://`).
    pub fn uses_tls(&self) -> bool {
        self.connection_infos().any(|info| is_tls(&info))
    }

    /// Its URLs as the Redis client reads them, those it cannot read left out ([`Topology::check`]
    /// refuses them).
    fn connection_infos(&self) -> impl Iterator<Item = ConnectionInfo> + '_ {
        self.urls()
            .iter()
            .filter_map(|url| url.as_str().into_connection_info().ok())
    }

    fn urls(&self) -> &[String] {
        match self {
            Topology::Standalone(url) => std::slice::from_ref(url),
            Topology::Cluster(urls)
            | Topology::Sentinel {
                sentinels: urls, ..
            } => urls,
        }
    }
}

/// Written without passwords: topologies are logged.
impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all = |urls: &[String]| urls.iter().map(|u| redacted(u)).collect::<Vec<_>>();
        match self {
            Topology::Standalone(url) => f.debug_tuple("Standalone").field(&redacted(url)).finish(),
            Topology::Cluster(urls) => f.debug_tuple("Cluster").field(&all(urls)).finish(),
            Topology::Sentinel { sentinels, master } => f
                .debug_struct("Sentinel")
                .field("sentinels", &all(sentinels))
                .field("master", master)
                .finish(),
        }
    }
}

/// Whether the client reaches `info` over TLS.
fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// `url` with its password, if it has one, written as `***`.
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // A URL with a password has a host, so it takes another.
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        // Not a URL, but it may still hold a password before an `@`.
        Err(_) => match url.rfind('@') {
            Some(at) => format!("***{}", &url[at..]),
            None => url.to_owned(),
        },
    }
}

/// What the server presents to Redis, and whom it trusts, beyond what the URLs say.
#[derive(Clone, Default)]
pub struct Credentials {
    /// The ACL user to log in as (else `default`), with `password`.
    pub username: Option<String>,
    /// The password of the servers that hold the limits: the standalone Redis, every node of
    /// a Cluster, the primary behind Sentinel. Sentinels' own are in their URLs.
    pub password: Option<String>,
    /// For `rediss://`: authorities to trust instead of the system's, and a certificate to
    /// present, to sentinels and to the primary they name as well.
    pub tls: Option<TlsCertificates>,
}

impl Credentials {
    /// `info` logging in as these credentials say, where they say anything.
    pub(super) fn log_in(&self, info: ConnectionInfo) -> ConnectionInfo {
        let mut settings = info.redis_settings().clone();
        if let Some(username) = &self.username {
            settings = settings.set_username(username);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password);
        }
        info.set_redis_settings(settings)
    }
}

/// Written without secrets: configurations are logged.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let given = |given: bool| if given { "***" } else { "none" };
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &given(self.password.is_some()))
            .field("tls", &given(self.tls.is_some()))
            .finish()
    }
}

/// How every TCP connection to Redis is set up: Nagle's algorithm off (`TCP_NODELAY`). Calls go
/// down one connection while others are in flight, and Nagle holds each write until Redis
/// acknowledges the last, which it does with its answer: across a network a decision then waits
/// a round trip more (docs/redis.md has the numbers; `server/tests/network.rs` holds it to one).
pub fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// A client asking `sentinels` for the primary `master`, logging in to the sentinels as their
/// URLs say and to the primary as `credentials` do, in the db number the URLs give (a sentinel
/// has none of its own); over TLS to both if the URLs say `rediss://` ([`Topology::check`] has
/// seen that they all agree).
pub(super) fn sentinel_client(
    sentinels: &[String],
    master: &str,
    credentials: &Credentials,
) -> RedisResult<SentinelClient> {
    let infos = sentinels
        .iter()
        .map(|url| url.as_str().into_connection_info())
        .collect::<RedisResult<Vec<_>>>()?;
    let mut builder = SentinelClientBuilder::new(
        infos.iter().map(|info| info.addr().clone()),
        master,
        SentinelServerType::Master,
    )?
    .set_client_to_sentinel_tcp_settings(tcp_settings())
    .set_client_to_redis_tcp_settings(tcp_settings());
    if let Some(first) = infos.first() {
        let login = first.redis_settings();
        builder = builder.set_client_to_redis_db(login.db());
        if let Some(username) = login.username() {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = login.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if is_tls(first) {
            builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
            if let Some(tls) = &credentials.tls {
                builder = builder
                    .set_client_to_sentinel_certificates(tls.clone())
                    .set_client_to_redis_certificates(tls.clone());
            }
        }
    }
    if let Some(username) = &credentials.username {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = &credentials.password {
        builder = builder.set_client_to_redis_password(password);
    }
    builder.build()
}
