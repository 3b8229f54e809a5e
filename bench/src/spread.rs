//! How the bench sums up a figure measured several times: its median and its range.

/// The median of `values` and their range; NaN for none.
pub fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = values.get(values.len() / 2).copied().unwrap_or(f64::NAN);
    let low = values.first().copied().unwrap_or(f64::NAN);
    let high = values.last().copied().unwrap_or(f64::NAN);
    (median, low, high)
}
