//! The reference rate limit service's configuration files (envoyproxy/ratelimit's YAML), read
//! from files or from every `.yaml` and `.yml` file of a directory, then validated once by
//! [`RlsConfig::from_raw`]; and [`WatchedConfig`], which reloads them when they change.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use sluice_core::rls::RlsConfig;
use sluice_core::rls::raw::RawRlsConfig;

/// A file that could not be loaded: which, where in it, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsLoadError {
    /// The file.
    pub file: PathBuf,
    /// The path in it (`descriptors[0].rate_limit.unit`), empty for the file as a whole.
    pub path: String,
    /// Why.
    pub reason: String,
}

impl fmt::Display for RlsLoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path.as_str() {
            "" | "." => write!(f, "{}: {}", self.file.display(), self.reason),
            path => write!(f, "{}: {}: {}", self.file.display(), path, self.reason),
        }
    }
}

impl std::error::Error for RlsLoadError {}

/// The configuration files `paths` name: a directory stands for its `.yaml` and `.yml` files,
/// in name order.
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, RlsLoadError> {
    let mut files = Vec::new();
    for path in paths {
        let whole = |reason: String| RlsLoadError {
            file: path.clone(),
            path: String::new(),
            reason,
        };
        if path.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|e| whole(e.to_string()))?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.is_file()
                        && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                })
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

fn parse(file: &Path, text: &str) -> Result<RawRlsConfig, RlsLoadError> {
    let deserializer = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        // serde_yaml_ng starts some messages with the path, or with its parent's (an unknown
        // field is named in the path, and its mapping in the message): once is enough.
        let message = e.into_inner().to_string();
        let reason = match message.split_once(": ") {
            Some((head, rest))
                if path == head
                    || path.starts_with(&format!("{head}."))
                    || path.starts_with(&format!("{head}[")) =>
            {
                rest.to_owned()
            }
            _ => message,
        };
        RlsLoadError {
            file: file.to_owned(),
            path,
            reason,
        }
    })
}

/// Reads and validates every file `paths` name.
pub fn load(paths: &[PathBuf]) -> Result<RlsConfig, RlsLoadError> {
    load_files(&files(paths)?)
}

fn load_files(files: &[PathBuf]) -> Result<RlsConfig, RlsLoadError> {
    let mut raws = Vec::with_capacity(files.len());
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|e| RlsLoadError {
            file: file.clone(),
            path: String::new(),
            reason: e.to_string(),
        })?;
        raws.push(parse(file, &text)?);
    }
    RlsConfig::from_raw(raws).map_err(|e| RlsLoadError {
        file: files[e.file].clone(),
        path: e.path,
        reason: e.reason,
    })
}

/// What a reload compares: each file's path, length and modification time.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

fn fingerprint(files: &[PathBuf]) -> Fingerprint {
    files
        .iter()
        .cloned()
        .map(|file| {
            let meta = std::fs::metadata(&file).ok();
            let len = meta.as_ref().map_or(0, std::fs::Metadata::len);
            let modified = meta.and_then(|m| m.modified().ok());
            (file, len, modified)
        })
        .collect()
}

/// The configuration in force, reloaded when its files change. A request takes the `Arc` in
/// force when it starts and decides on it to the end, so a reload never disturbs a request in
/// flight; a configuration that fails to load leaves the one in force in place.
#[derive(Debug)]
pub struct WatchedConfig {
    paths: Vec<PathBuf>,
    current: RwLock<Arc<RlsConfig>>,
    seen: RwLock<Fingerprint>,
}

/// What a reload did.
#[derive(Debug)]
pub enum Reload {
    /// Nothing changed on disk.
    Unchanged,
    /// The files changed and the new configuration is in force.
    Loaded,
    /// The files changed but do not load; the previous configuration stays in force.
    Failed(RlsLoadError),
}

impl WatchedConfig {
    /// Loads `paths` (files, or directories of `.yaml`/`.yml` files); fails as [`load`] does.
    pub fn load(paths: Vec<PathBuf>) -> Result<WatchedConfig, RlsLoadError> {
        let files = files(&paths)?;
        let seen = fingerprint(&files);
        let config = load_files(&files)?;
        Ok(WatchedConfig {
            paths,
            current: RwLock::new(Arc::new(config)),
            seen: RwLock::new(seen),
        })
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<RlsConfig> {
        // A poisoned lock only means a panic elsewhere mid-swap; the Arc inside is whole.
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Loads the files again if they changed since the last look.
    pub fn reload_if_changed(&self) -> Reload {
        // A directory that cannot be listed now is a change, and fails to load below.
        let files = files(&self.paths);
        let now = fingerprint(files.as_deref().unwrap_or_default());
        {
            let mut seen = self.seen.write().unwrap_or_else(|e| e.into_inner());
            if *seen == now {
                return Reload::Unchanged;
            }
            *seen = now;
        }
        match files.and_then(|files| load_files(&files)) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
                Reload::Loaded
            }
            Err(e) => Reload::Failed(e),
        }
    }

    /// Looks for changes every `every` while the returned task runs, calling `on_reload` with
    /// each change's outcome.
    pub fn keep_watching(
        self: &Arc<Self>,
        every: Duration,
        on_reload: impl Fn(&Reload) + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let watched = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(watched) = watched.upgrade() else {
                    return;
                };
                let paths = watched.paths.clone();
                // Reading and parsing files blocks; keep it off the runtime's workers.
                let outcome =
                    tokio::task::spawn_blocking(move || watched.reload_if_changed()).await;
                match outcome {
                    Ok(Reload::Unchanged) => {}
                    Ok(reload) => on_reload(&reload),
                    Err(e) => {
                        tracing::error!(?paths, error = %e, "reloading the rate limit configuration failed")
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directory(files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sluice-rls-{}-{}",
            std::process::id(),
            files.first().map_or("", |f| f.0)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn a_directory_loads_each_yaml_file_as_a_domain() {
        let dir = directory(&[
            (
                "a.yaml",
                "domain: shop\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n",
            ),
            ("b.yml", "domain: api\ndescriptors: []\n"),
            ("notes.txt", "not configuration"),
        ]);
        let config = load(std::slice::from_ref(&dir)).unwrap();
        assert_eq!(config.domains().collect::<Vec<_>>(), ["api", "shop"]);
        let found = config
            .lookup("shop", &[("remote_address", "10.0.0.1")])
            .unwrap();
        assert_eq!(found.rule.requests_per_unit, 10);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn errors_name_the_file_the_path_in_it_and_the_reason() {
        let dir = directory(&[(
            "bad-type.yaml",
            "domain: shop\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: ten\n",
        )]);
        let err = load(std::slice::from_ref(&dir)).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "{}: descriptors[0].rate_limit.requests_per_unit: invalid type",
                dir.join("bad-type.yaml").display()
            )),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let dir = directory(&[(
            "bad-key.yaml",
            "domain: shop\ndescriptors:\n  - key: k\n    rate_limt: {}\n",
        )]);
        let err = load(std::slice::from_ref(&dir)).unwrap_err().to_string();
        assert!(
            err.contains("bad-key.yaml: descriptors[0].rate_limt: unknown field `rate_limt`"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let dir = directory(&[("1.yaml", "domain: shop\n"), ("2.yaml", "domain: shop\n")]);
        let err = load(std::slice::from_ref(&dir)).unwrap_err();
        assert_eq!(
            err.file,
            dir.join("2.yaml"),
            "the second file names the domain again"
        );
        assert_eq!(err.path, "domain");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_change_is_loaded_and_a_broken_change_keeps_the_configuration_in_force() {
        let dir = directory(&[(
            "reload.yaml",
            "domain: shop\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        )]);
        let watched = WatchedConfig::load(vec![dir.clone()]).unwrap();
        assert!(matches!(watched.reload_if_changed(), Reload::Unchanged));
        let before = watched.current();
        let limit_of = |config: &RlsConfig| {
            config
                .lookup("shop", &[("k", "v")])
                .map(|f| f.rule.requests_per_unit)
        };
        std::fs::write(
            dir.join("reload.yaml"),
            "domain: shop\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 20}\n",
        )
        .unwrap();
        assert!(matches!(watched.reload_if_changed(), Reload::Loaded));
        assert_eq!(limit_of(&watched.current()), Some(20));
        assert_eq!(
            limit_of(&before),
            Some(1),
            "a request in flight keeps its configuration"
        );

        std::fs::write(
            dir.join("reload.yaml"),
            "domain: shop\ndescriptors: [{key: k, rate_limit: {unit: eon}}]\n",
        )
        .unwrap();
        let Reload::Failed(e) = watched.reload_if_changed() else {
            panic!("a broken file must fail to load");
        };
        assert!(
            e.to_string()
                .contains("rate_limit.unit: unknown unit `eon`"),
            "{e}"
        );
        assert_eq!(
            limit_of(&watched.current()),
            Some(20),
            "the last good configuration stays"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
