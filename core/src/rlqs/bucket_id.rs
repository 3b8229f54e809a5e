//! A bucket id: the entries Envoy's `bucket_id_builder` made for a request, kept compact. A
//! quota stream holds one a bucket, and a report one a bucket it names, so a sorted boxed
//! slice, not a `BTreeMap` (whose first node takes over 500 bytes for any number of entries).

use std::collections::BTreeMap;
use std::fmt;

/// Entries sorted by key, each key once.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BucketId(Box<[(Box<str>, Box<str>)]>);

impl BucketId {
    /// The value of `key`, if the id holds it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    /// Its entries, sorted by key.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The bytes of its keys and values.
    pub fn len_bytes(&self) -> usize {
        self.entries().map(|(k, v)| k.len() + v.len()).sum()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for BucketId {
    /// The id of `entries`; of two entries with one key, the last.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> BucketId {
        let sorted: BTreeMap<String, String> = entries
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        BucketId(
            sorted
                .into_iter()
                .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
                .collect(),
        )
    }
}

impl fmt::Debug for BucketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.entries()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_kept_sorted_by_key_and_found_by_it() {
        let id: BucketId = [("name", "per-key"), ("key", "k1"), ("a", "b")]
            .into_iter()
            .collect();
        assert_eq!(
            id.entries().collect::<Vec<_>>(),
            [("a", "b"), ("key", "k1"), ("name", "per-key")]
        );
        assert_eq!(id.get("key"), Some("k1"));
        assert_eq!(id.get("missing"), None);
        assert_eq!(id.len_bytes(), 1 + 1 + 3 + 2 + 4 + 7);
        let same: BucketId = [("key", "k1"), ("a", "b"), ("name", "per-key")]
            .into_iter()
            .collect();
        assert_eq!(id, same, "the order entries come in is not part of the id");
    }
}
