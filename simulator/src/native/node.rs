//! A walk through an Envoy configuration that knows where it is: every value read carries its
//! path (`static_resources.listeners[0].filter_chains[0]...`), so whatever is refused is named
//! where the user wrote it.

use serde_json::Value;

/// A part of the configuration the simulator cannot read or cannot model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ConfigError {
    /// Where, as `a.b[2].c`.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// One value of the configuration, and where it sits.
#[derive(Debug, Clone)]
pub(crate) struct Node<'a> {
    pub value: &'a Value,
    pub path: String,
}

impl<'a> Node<'a> {
    pub fn root(value: &'a Value) -> Node<'a> {
        Node {
            value,
            path: String::new(),
        }
    }

    pub fn error(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            path: if self.path.is_empty() {
                "(top)".to_owned()
            } else {
                self.path.clone()
            },
            reason: reason.into(),
        }
    }

    fn child_path(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    /// The field `name`, when present and not null.
    pub fn field(&self, name: &str) -> Option<Node<'a>> {
        let value = self.value.get(name).filter(|v| !v.is_null())?;
        Some(Node {
            value,
            path: self.child_path(name),
        })
    }

    /// The field `name`, which must be present.
    pub fn required(&self, name: &str) -> Result<Node<'a>, ConfigError> {
        self.field(name)
            .ok_or_else(|| self.error(format!("`{name}` is required here")))
    }

    /// The list in field `name` (empty when absent).
    pub fn list(&self, name: &str) -> Result<Vec<Node<'a>>, ConfigError> {
        let Some(field) = self.field(name) else {
            return Ok(Vec::new());
        };
        let items = field
            .value
            .as_array()
            .ok_or_else(|| field.error("must be a list"))?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, value)| Node {
                value,
                path: format!("{}[{i}]", field.path),
            })
            .collect())
    }

    /// The string in field `name`, when present.
    pub fn string(&self, name: &str) -> Result<Option<&'a str>, ConfigError> {
        self.field(name)
            .map(|f| f.value.as_str().ok_or_else(|| f.error("must be a string")))
            .transpose()
    }

    /// The boolean in field `name` (also as a `{value: ...}` wrapper), when present.
    pub fn bool(&self, name: &str) -> Result<Option<bool>, ConfigError> {
        self.field(name)
            .map(|f| {
                let value = f.value.get("value").unwrap_or(f.value);
                value
                    .as_bool()
                    .ok_or_else(|| f.error("must be true or false"))
            })
            .transpose()
    }

    /// The whole number in field `name` (also as a string or a `{value: ...}` wrapper), when
    /// present.
    pub fn u64(&self, name: &str) -> Result<Option<u64>, ConfigError> {
        self.field(name)
            .map(|f| {
                let value = f.value.get("value").unwrap_or(f.value);
                value
                    .as_u64()
                    .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
                    .ok_or_else(|| f.error("must be a whole number"))
            })
            .transpose()
    }

    /// Refuses any field besides `known`, naming it: what the simulator does not model must not
    /// be silently left out.
    pub fn only(&self, known: &[&str], what: &str) -> Result<(), ConfigError> {
        let Some(object) = self.value.as_object() else {
            return Err(self.error("must be a mapping"));
        };
        match object.keys().find(|k| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some(unknown) => Err(ConfigError {
                path: self.child_path(unknown),
                reason: format!(
                    "the simulator does not model `{unknown}` in {what}; it models {}",
                    known
                        .iter()
                        .filter(|k| !k.starts_with('@'))
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    /// The one field of a `oneof` this value sets, among `choices`, refusing any other.
    pub fn one_of<'c>(
        &self,
        choices: &[&'c str],
        what: &str,
    ) -> Result<(&'c str, Node<'a>), ConfigError> {
        self.only(choices, what)?;
        let object = self
            .value
            .as_object()
            .ok_or_else(|| self.error("must be a mapping"))?;
        let mut set = object.iter().filter(|(_, v)| !v.is_null());
        match (set.next(), set.next()) {
            (Some((name, _)), None) => {
                let choice = choices
                    .iter()
                    .find(|c| **c == name.as_str())
                    .copied()
                    .unwrap_or_default();
                Ok((choice, self.required(name)?))
            }
            (None, _) => Err(self.error(format!("{what} needs one of {}", choices.join(", ")))),
            (Some(_), Some(_)) => {
                Err(self.error(format!("{what} takes only one of {}", choices.join(", "))))
            }
        }
    }
}

/// Parses `text` (YAML, or JSON, which is YAML) into a value to walk.
pub fn parse_yaml(text: &str) -> Result<Value, ConfigError> {
    serde_yaml_ng::from_str(text).map_err(|e| ConfigError {
        path: e
            .location()
            .map_or_else(|| "(file)".to_owned(), |l| format!("line {}", l.line())),
        reason: e.to_string(),
    })
}
