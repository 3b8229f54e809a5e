//! The reference rate limit service's configuration files (envoyproxy/ratelimit's YAML), read
//! from files or from every `.yaml` and `.yml` file of a directory, then validated once by
//! [`RlsConfig::from_raw`].

use std::fmt;
use std::path::{Path, PathBuf};

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
        // serde_yaml_ng starts some messages with the path itself.
        let message = e.into_inner().to_string();
        let reason = message
            .strip_prefix(&format!("{path}: "))
            .unwrap_or(&message)
            .to_owned();
        RlsLoadError {
            file: file.to_owned(),
            path,
            reason,
        }
    })
}

/// Reads and validates every file `paths` name.
pub fn load(paths: &[PathBuf]) -> Result<RlsConfig, RlsLoadError> {
    let files = files(paths)?;
    let mut raws = Vec::with_capacity(files.len());
    for file in &files {
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
            err.contains("descriptors[0]: unknown field `rate_limt`"),
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
}
