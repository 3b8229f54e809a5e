//! The quota service's configuration files (`--rlqs-config`), loaded and reloaded as
//! [`crate::config_files`] loads any, and validated by [`RlqsConfig::from_raw`].

use std::collections::BTreeMap;

use sluice_core::rlqs::RlqsConfig;
use sluice_core::rlqs::raw::RawRlqsConfig;

use sluice_core::file_error::FileError;

use crate::config_files::{self, FromFiles};

/// The quota configuration in force, reloaded when its files change.
pub type WatchedConfig = config_files::WatchedConfig<RlqsConfig>;

impl FromFiles for RlqsConfig {
    type Raw = RawRlqsConfig;

    fn from_raw(raws: Vec<RawRlqsConfig>) -> Result<RlqsConfig, FileError> {
        RlqsConfig::from_raw(raws)
    }

    fn limits_per_domain(&self) -> BTreeMap<String, usize> {
        self.limits_per_domain()
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::rlqs::{BucketId, Quota};

    use super::*;
    use crate::config_files::load;

    #[test]
    fn yaml_files_load_and_their_errors_name_the_file_the_path_and_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let shop = dir.path().join("shop.yaml");
        std::fs::write(
            &shop,
            "domain: shop\n\
             buckets:\n\
             \x20 - match: {name: per-key, key: \"*\"}\n\
             \x20   limit: {algorithm: token_bucket, rate: 100, per: 1s, burst: 100}\n\
             \x20   share: equal\n\
             default: {deny: all}\n\
             idle_after: 10m\n",
        )
        .unwrap();
        let config: RlqsConfig = load(&[dir.path().to_owned()]).unwrap();
        let bucket = BucketId::from_iter([("name", "per-key"), ("key", "k1")]);
        assert!(matches!(
            config.rule_for("shop", &bucket).unwrap().quota,
            Quota::Limit(_)
        ));

        std::fs::write(
            &shop,
            "domain: shop\nbuckets:\n  - match: {name: per-key}\n    limit: {algorithm: token_bucket, rate: 100, per: 1s}\n",
        )
        .unwrap();
        let err = load::<RlqsConfig>(std::slice::from_ref(&shop))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "{}: buckets[0].limit: algorithm `token_bucket` needs `burst`",
                shop.display()
            )
        );
        std::fs::write(
            &shop,
            "domain: shop\nbuckets:\n  - match: {k: v}\n    alow: all\n",
        )
        .unwrap();
        let err = load::<RlqsConfig>(std::slice::from_ref(&shop))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("shop.yaml: buckets[0].alow: unknown field `alow`"),
            "{err}"
        );
    }
}
