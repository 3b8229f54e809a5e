//! Metrics fed by what clients send, bounded: label values drawn from requests, and counts
//! added from them.
//!
//! A metric labelled by a rule name or a descriptor's stats key takes its values from clients:
//! unbounded, any client could grow `/metrics` and the server's memory at will (100,000
//! distinct rule names took `/metrics` from 7.8 kB to 5.9 MB; three 3 MB descriptor values,
//! to 22.9 MB). So each such label keeps at most [`MAX_VALUES`] distinct values, each at most
//! [`MAX_BYTES`] long; values past the cap are counted under [`OVERFLOW`], and
//! `sluice_label_overflow_total{label}` counts how often that happened.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::RwLock;
use std::sync::atomic::Ordering;

use prometheus_client::metrics::counter::Counter;

/// Distinct values one label keeps.
pub const MAX_VALUES: usize = 1_000;

/// The longest label value kept; longer ones are cut (at a character boundary).
pub const MAX_BYTES: usize = 128;

/// The value counted in place of those past the cap.
pub const OVERFLOW: &str = "_overflow";

/// The values one label has taken, and the counter of those it refused.
#[derive(Debug)]
pub struct LabelBudget {
    taken: RwLock<HashSet<String>>,
    overflowed: Counter,
}

impl LabelBudget {
    /// A budget counting refused values on `overflowed`.
    pub fn new(overflowed: Counter) -> LabelBudget {
        LabelBudget {
            taken: RwLock::new(HashSet::new()),
            overflowed,
        }
    }

    /// The label value to count `value` under: itself (cut to [`MAX_BYTES`]) while the label
    /// has room or already has it, else [`OVERFLOW`].
    pub fn label<'a>(&self, value: &'a str) -> Cow<'a, str> {
        let value = cut(value);
        // A value already taken, the common case on every request: a shared lock only.
        if self
            .taken
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(value)
        {
            return Cow::Borrowed(value);
        }
        let mut taken = self
            .taken
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Taken meanwhile by another request, or new.
        if !taken.contains(value) {
            if taken.len() >= MAX_VALUES {
                self.overflowed.inc();
                return Cow::Borrowed(OVERFLOW);
            }
            taken.insert(value.to_owned());
        }
        Cow::Borrowed(value)
    }
}

/// `value`, cut to at most [`MAX_BYTES`] at a character boundary.
fn cut(value: &str) -> &str {
    if value.len() <= MAX_BYTES {
        return value;
    }
    let mut end = MAX_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

/// Adds `n` to `counter`, stopping at `u64::MAX`: a counter fed by numbers a client sends
/// (a quota report's requests, a descriptor's hits) must never wrap, which Prometheus would
/// read as a reset.
pub fn add_saturating(counter: &Counter, n: u64) {
    let _ = counter
        .inner()
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_add(n))
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_fed_by_clients_stops_at_its_largest_value_and_never_wraps() {
        let counter = Counter::default();
        add_saturating(&counter, 300);
        add_saturating(&counter, u64::MAX);
        assert_eq!(counter.get(), u64::MAX);
        add_saturating(&counter, 2);
        assert_eq!(counter.get(), u64::MAX);
    }

    #[test]
    fn values_past_the_cap_are_counted_as_overflow() {
        let overflowed = Counter::default();
        let budget = LabelBudget::new(overflowed.clone());
        for i in 0..MAX_VALUES {
            assert_eq!(budget.label(&format!("rule-{i}")), format!("rule-{i}"));
        }
        assert_eq!(budget.label("rule-7"), "rule-7", "a value it has stays");
        assert_eq!(budget.label("one-too-many"), OVERFLOW);
        assert_eq!(budget.label("another"), OVERFLOW);
        assert_eq!(overflowed.get(), 2);
    }

    #[test]
    fn long_values_are_cut_at_a_character_boundary() {
        let budget = LabelBudget::new(Counter::default());
        let long = "é".repeat(200);
        let label = budget.label(&long);
        assert!(
            label.len() <= MAX_BYTES && label.chars().all(|c| c == 'é'),
            "{label}"
        );
    }
}
