//! An ordered header map, as Envoy keeps request, response and callout headers.

/// An ordered header map with lower-case names; a name may repeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderMap {
    pairs: Vec<(String, Vec<u8>)>,
}

fn lower(name: &[u8]) -> String {
    match std::str::from_utf8(name) {
        // The common case, names already in lower case: one copy.
        Ok(name) if !name.bytes().any(|b| b.is_ascii_uppercase()) => name.to_owned(),
        _ => String::from_utf8_lossy(name).to_ascii_lowercase(),
    }
}

impl HeaderMap {
    /// A map of these pairs, names lower-cased.
    pub fn from_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> HeaderMap {
        HeaderMap {
            pairs: pairs
                .into_iter()
                .map(|(k, v)| (lower(k.as_ref()), v.as_ref().to_vec()))
                .collect(),
        }
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.get_bytes(name.as_bytes())
    }

    /// The first value of `name`, given as bytes (a name that is not UTF-8 matches none).
    pub fn get_bytes(&self, name: &[u8]) -> Option<&[u8]> {
        self.position(name).map(|i| self.pairs[i].1.as_slice())
    }

    /// Where the first value of `name` is among the pairs.
    pub fn position(&self, name: &[u8]) -> Option<usize> {
        // Names are stored in lower case: comparing without case is comparing with `name`
        // lower-cased.
        self.pairs
            .iter()
            .position(|(k, _)| k.as_bytes().eq_ignore_ascii_case(name))
    }

    /// Appends a value.
    pub fn add(&mut self, name: &[u8], value: impl Into<Vec<u8>>) {
        self.pairs.push((lower(name), value.into()));
    }

    /// Replaces every value of `name` by one (appending it if absent).
    pub fn replace(&mut self, name: &[u8], value: impl Into<Vec<u8>>) {
        let name = lower(name);
        match self.pairs.iter().position(|(k, _)| *k == name) {
            Some(first) => {
                self.pairs[first].1 = value.into();
                let mut i = 0;
                self.pairs.retain(|(k, _)| {
                    i += 1;
                    i - 1 == first || *k != name
                });
            }
            None => self.pairs.push((name, value.into())),
        }
    }

    /// Removes every value of `name`.
    pub fn remove(&mut self, name: &[u8]) {
        let name = lower(name);
        self.pairs.retain(|(k, _)| *k != name);
    }

    /// The pairs, in order.
    pub fn pairs(&self) -> &[(String, Vec<u8>)] {
        &self.pairs
    }

    /// The pairs, in order, given up.
    pub fn into_pairs(self) -> Vec<(String, Vec<u8>)> {
        self.pairs
    }

    /// Bytes of names and values, as Envoy's `byteSize()`.
    pub fn byte_size(&self) -> usize {
        self.pairs.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lower_cased_and_gets_return_the_first_value() {
        let mut h = HeaderMap::from_pairs([("X-A", "1"), ("x-a", "2")]);
        assert_eq!(h.get("X-a"), Some(&b"1"[..]));
        h.replace(b"X-A", b"3");
        assert_eq!(h.pairs(), [("x-a".to_owned(), b"3".to_vec())]);
        h.add(b"Y", b"");
        assert_eq!(h.byte_size(), 3 + 1 + 1);
        h.remove(b"x-A");
        assert_eq!(h.len(), 1);
    }
}
