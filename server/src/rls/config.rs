//! The reference rate limit service's configuration files (envoyproxy/ratelimit's YAML), loaded
//! and reloaded as [`crate::config_files`] loads any, and validated by [`RlsConfig::from_raw`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use sluice_core::rls::RlsConfig;
use sluice_core::rls::raw::RawRlsConfig;

use sluice_core::file_error::FileError;

use crate::config_files::{self, FromFiles, LoadError};

/// The rate limit configuration in force, reloaded when its files change.
pub type WatchedConfig = config_files::WatchedConfig<RlsConfig>;

impl FromFiles for RlsConfig {
    type Raw = RawRlsConfig;

    fn from_raw(raws: Vec<RawRlsConfig>) -> Result<RlsConfig, FileError> {
        RlsConfig::from_raw(raws)
    }

    fn limits_per_domain(&self) -> BTreeMap<String, usize> {
        self.limits_per_domain()
    }
}

/// Reads and validates every file `paths` name.
pub fn load(paths: &[PathBuf]) -> Result<RlsConfig, LoadError> {
    config_files::load(paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_files::Reload;

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
        assert!(
            matches!(watched.reload_if_changed(), Reload::Unchanged),
            "a change waits for a second look"
        );
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
        watched.reload_if_changed();
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

    const SHOP: &str = "domain: shop\ndescriptors:\n  - key: free\n    rate_limit: {unlimited: true}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    const API: &str = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n";

    /// The limit `shop`'s `user` descriptor is held to under the configuration in force.
    fn user_limit(watched: &WatchedConfig) -> Option<u64> {
        watched
            .current()
            .lookup("shop", &[("user", "a")])
            .map(|f| f.rule.requests_per_unit)
    }

    #[test]
    fn a_file_still_being_written_is_loaded_only_once_two_looks_read_it_the_same() {
        let dir = directory(&[("shop.yaml", SHOP)]);
        let watched = WatchedConfig::load(vec![dir.clone()]).unwrap();
        // Cut off before its limited descriptor: still valid YAML, and unlimited.
        let cut = &SHOP[..SHOP.find("  - key: user").unwrap()];
        std::fs::write(dir.join("shop.yaml"), cut).unwrap();
        assert!(matches!(watched.reload_if_changed(), Reload::Unchanged));
        std::fs::write(dir.join("shop.yaml"), SHOP.replace("100", "50")).unwrap();
        assert!(
            matches!(watched.reload_if_changed(), Reload::Unchanged),
            "the file changed again since the last look: the writer is not done"
        );
        assert_eq!(user_limit(&watched), Some(100));
        assert!(matches!(watched.reload_if_changed(), Reload::Loaded));
        assert_eq!(user_limit(&watched), Some(50));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_reload_that_drops_a_domain_or_all_its_limits_is_refused_until_restored() {
        let dir = directory(&[("a-shop.yaml", SHOP), ("api.yaml", API)]);
        let watched = WatchedConfig::load(vec![dir.clone()]).unwrap();
        let settle = |watched: &WatchedConfig| {
            assert!(matches!(watched.reload_if_changed(), Reload::Unchanged));
            watched.reload_if_changed()
        };

        std::fs::remove_file(dir.join("api.yaml")).unwrap();
        let Reload::Refused(dropped) = settle(&watched) else {
            panic!("a vanished domain must be refused");
        };
        assert_eq!(dropped.domains, ["api"]);
        assert!(
            dropped
                .to_string()
                .starts_with("the change would drop domain(s) api; restore"),
            "{dropped}"
        );
        assert!(watched.current().lookup("api", &[("k", "v")]).is_some());
        assert!(
            matches!(watched.reload_if_changed(), Reload::Unchanged),
            "refused once per change"
        );

        // The cut-off file, settled: it would leave `shop` with its unlimited descriptor only.
        let cut = &SHOP[..SHOP.find("  - key: user").unwrap()];
        std::fs::write(dir.join("a-shop.yaml"), cut).unwrap();
        let Reload::Refused(dropped) = settle(&watched) else {
            panic!("a domain left without a limit must be refused");
        };
        assert_eq!(dropped.limits_of, ["shop"]);
        assert_eq!(user_limit(&watched), Some(100));

        std::fs::write(dir.join("a-shop.yaml"), SHOP.replace("100", "70")).unwrap();
        std::fs::write(dir.join("api.yaml"), API).unwrap();
        assert!(matches!(settle(&watched), Reload::Loaded), "restored");
        assert_eq!(user_limit(&watched), Some(70));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
