//! Configuration files named by a flag (`--rls-config`, `--rlqs-config`): YAML read from files
//! or from every `.yaml` and `.yml` file of a directory, each file parsed raw, then all of them
//! validated once ([`FromFiles`]); and [`WatchedConfig`], which reloads them when they change.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use sluice_core::file_error::FileError;

/// A configuration made of files, one raw value each, validated together.
pub trait FromFiles: Sized {
    /// One file as written.
    type Raw: DeserializeOwned;

    /// Validates `raws`; the error names the file (its index in `raws`), the path in it and
    /// the reason.
    fn from_raw(raws: Vec<Self::Raw>) -> Result<Self, FileError>;
}

/// A file that could not be loaded: which, where in it, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The file.
    pub file: PathBuf,
    /// The path in it (`descriptors[0].rate_limit.unit`), empty for the file as a whole.
    pub path: String,
    /// Why.
    pub reason: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path.as_str() {
            "" | "." => write!(f, "{}: {}", self.file.display(), self.reason),
            path => write!(f, "{}: {}: {}", self.file.display(), path, self.reason),
        }
    }
}

impl std::error::Error for LoadError {}

/// The configuration files `paths` name: a directory stands for its `.yaml` and `.yml` files,
/// in name order.
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, LoadError> {
    let mut files = Vec::new();
    for path in paths {
        let whole = |reason: String| LoadError {
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

fn parse<R: DeserializeOwned>(file: &Path, text: &str) -> Result<R, LoadError> {
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
        LoadError {
            file: file.to_owned(),
            path,
            reason,
        }
    })
}

/// Reads and validates every file `paths` name.
pub fn load<C: FromFiles>(paths: &[PathBuf]) -> Result<C, LoadError> {
    load_files(&files(paths)?)
}

fn load_files<C: FromFiles>(files: &[PathBuf]) -> Result<C, LoadError> {
    let mut raws = Vec::with_capacity(files.len());
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|e| LoadError {
            file: file.clone(),
            path: String::new(),
            reason: e.to_string(),
        })?;
        raws.push(parse(file, &text)?);
    }
    C::from_raw(raws).map_err(|e| LoadError {
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
pub struct WatchedConfig<C> {
    paths: Vec<PathBuf>,
    current: RwLock<Arc<C>>,
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
    Failed(LoadError),
}

impl<C: FromFiles + Send + Sync + 'static> WatchedConfig<C> {
    /// Loads `paths` (files, or directories of `.yaml`/`.yml` files); fails as [`load`] does.
    pub fn load(paths: Vec<PathBuf>) -> Result<WatchedConfig<C>, LoadError> {
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
    pub fn current(&self) -> Arc<C> {
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
                        tracing::error!(?paths, error = %e, "reloading a configuration failed")
                    }
                }
            }
        })
    }
}
