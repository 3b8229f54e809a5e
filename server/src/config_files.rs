//! Configuration files named by a flag (`--rls-config`, `--rlqs-config`): YAML read from files
//! or from every `.yaml` and `.yml` file of a directory, each file parsed raw, then all of them
//! validated once ([`FromFiles`]); and [`WatchedConfig`], which reloads them when they change,
//! once they have settled, and never so as to drop a domain or its limits.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::de::DeserializeOwned;
use sluice_core::file_error::FileError;

/// A configuration made of files, one raw value each, validated together.
pub trait FromFiles: Sized {
    /// One file as written.
    type Raw: DeserializeOwned;

    /// Validates `raws`; the error names the file (its index in `raws`), the path in it and
    /// the reason.
    fn from_raw(raws: Vec<Self::Raw>) -> Result<Self, FileError>;

    /// Each domain and how many limits (rules that can deny) it holds: what a reload may not
    /// drop.
    fn limits_per_domain(&self) -> BTreeMap<String, usize>;
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
    load_read(&read(files))
}

/// Each file and what reading it gave: the text, or why it could not be read.
type Read = Vec<(PathBuf, Result<String, String>)>;

fn read(files: &[PathBuf]) -> Read {
    files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file).map_err(|e| e.to_string());
            (file.clone(), text)
        })
        .collect()
}

fn load_read<C: FromFiles>(read: &Read) -> Result<C, LoadError> {
    let mut raws = Vec::with_capacity(read.len());
    for (file, text) in read {
        let text = text.as_ref().map_err(|reason| LoadError {
            file: file.clone(),
            path: String::new(),
            reason: reason.clone(),
        })?;
        raws.push(parse(file, text)?);
    }
    C::from_raw(raws).map_err(|e| LoadError {
        file: read[e.file].0.clone(),
        path: e.path,
        reason: e.reason,
    })
}

/// The configuration in force, reloaded when its files change. A request takes the `Arc` in
/// force when it starts and decides on it to the end, so a reload never disturbs a request in
/// flight; a configuration that fails to load leaves the one in force in place.
///
/// Two guards keep a file caught mid-change from lifting limits (docs/config.md):
/// - a change is loaded only once two looks in a row read the very same files, so a file
///   still being written (often valid YAML cut short) waits for the writer to finish;
/// - a change that would drop a domain, or every limit of one, is refused
///   ([`Reload::Refused`]) until the files hold them again or the server restarts: a file
///   deleted and written anew would otherwise leave its domain unlimited in between.
#[derive(Debug)]
pub struct WatchedConfig<C> {
    paths: Vec<PathBuf>,
    current: RwLock<Arc<C>>,
    looks: Mutex<Looks>,
}

/// What the last looks at the files read.
#[derive(Debug)]
struct Looks {
    /// What the configuration in force was made of (or last refused or failed).
    settled: Read,
    /// A change seen once, waiting for a second look to read the same.
    pending: Option<Read>,
}

/// What a reload did.
#[derive(Debug)]
pub enum Reload {
    /// Nothing changed on disk, or a change is not yet the same across two looks.
    Unchanged,
    /// The files changed and the new configuration is in force.
    Loaded,
    /// The files changed but do not load; the previous configuration stays in force.
    Failed(LoadError),
    /// The files load but would drop a domain, or every limit of one; the previous
    /// configuration stays in force.
    Refused(Dropped),
}

/// What a refused reload would have dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// Domains the files no longer configure.
    pub domains: Vec<String>,
    /// Domains still configured that would keep no limit.
    pub limits_of: Vec<String>,
}

impl Dropped {
    /// What `new` drops of `old`, if anything.
    pub fn between<C: FromFiles>(old: &C, new: &C) -> Option<Dropped> {
        let new = new.limits_per_domain();
        let mut dropped = Dropped {
            domains: Vec::new(),
            limits_of: Vec::new(),
        };
        for (domain, limits) in old.limits_per_domain() {
            match new.get(&domain) {
                None => dropped.domains.push(domain),
                Some(0) if limits > 0 => dropped.limits_of.push(domain),
                Some(_) => {}
            }
        }
        (!dropped.domains.is_empty() || !dropped.limits_of.is_empty()).then_some(dropped)
    }
}

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the change would ")?;
        if !self.domains.is_empty() {
            write!(f, "drop domain(s) {}", self.domains.join(", "))?;
            if !self.limits_of.is_empty() {
                f.write_str(" and ")?;
            }
        }
        if !self.limits_of.is_empty() {
            write!(
                f,
                "leave domain(s) {} without a limit",
                self.limits_of.join(", ")
            )?;
        }
        f.write_str(
            "; restore the files, or restart the server to drop them (replace files by renaming a complete file over them)",
        )
    }
}

impl<C: FromFiles + Send + Sync + 'static> WatchedConfig<C> {
    /// Loads `paths` (files, or directories of `.yaml`/`.yml` files); fails as [`load`] does.
    pub fn load(paths: Vec<PathBuf>) -> Result<WatchedConfig<C>, LoadError> {
        let read = read(&files(&paths)?);
        let config = load_read(&read)?;
        Ok(WatchedConfig {
            paths,
            current: RwLock::new(Arc::new(config)),
            looks: Mutex::new(Looks {
                settled: read,
                pending: None,
            }),
        })
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<C> {
        // A poisoned lock only means a panic elsewhere mid-swap; the Arc inside is whole.
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Loads the files again if they changed, and read the same at the last look as at this.
    pub fn reload_if_changed(&self) -> Reload {
        let files = files(&self.paths);
        let now = match &files {
            Ok(files) => read(files),
            // A directory that cannot be listed now is a change, and fails to load below.
            Err(e) => vec![(e.file.clone(), Err(e.reason.clone()))],
        };
        {
            let mut looks = self.looks.lock().unwrap_or_else(|e| e.into_inner());
            if looks.settled == now {
                looks.pending = None;
                return Reload::Unchanged;
            }
            if looks.pending.as_ref() != Some(&now) {
                looks.pending = Some(now);
                return Reload::Unchanged;
            }
            looks.pending = None;
            looks.settled = now.clone();
        }
        let config = match files.and_then(|_| load_read::<C>(&now)) {
            Ok(config) => config,
            Err(e) => return Reload::Failed(e),
        };
        if let Some(dropped) = Dropped::between(&*self.current(), &config) {
            return Reload::Refused(dropped);
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        Reload::Loaded
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
