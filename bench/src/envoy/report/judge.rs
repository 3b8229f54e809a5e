//! How a figure is judged against a bar: the median and range of its rounds, and whether
//! every round meets it.

use std::fmt::Write as _;

pub(super) use crate::spread::spread;

/// Whether a single figure meets a bar.
pub(super) fn plain(met: bool) -> &'static str {
    if met { "**met**" } else { "**not met**" }
}

/// Whether the bar on `figures` is met, as [`plain`] says; "not measured" where one of them is
/// missing (`--only` left out its setup, and a NaN compares as not met).
pub(super) fn plain_of(figures: &[f64], met: bool) -> &'static str {
    if figures.iter().any(|f| f.is_nan()) {
        "not measured"
    } else {
        plain(met)
    }
}

/// Whether every round meets a bar: `met`, `not met`, or, where rounds differ, that the range
/// straddles it.
pub(super) fn verdict(per_round: &[bool]) -> &'static str {
    if per_round.is_empty() {
        // `--only` left out a setup the bar needs.
        "not measured"
    } else if per_round.iter().all(|&m| m) {
        "**met** in every round"
    } else if per_round.iter().any(|&m| m) {
        "**not met**: the rounds straddle it"
    } else {
        "**not met** in any round"
    }
}

/// A bar on a ratio at most `max` in every round: its median, range (to `digits` places) and
/// verdict.
pub(super) fn ratio_bar(
    out: &mut String,
    bar: &str,
    ratios: &[f64],
    max: f64,
    digits: usize,
) -> anyhow::Result<()> {
    let met: Vec<bool> = ratios.iter().map(|r| *r <= max).collect();
    let (median, low, high) = spread(ratios.to_vec());
    writeln!(
        out,
        "- {bar}: {median:.digits$} [{low:.digits$} .. {high:.digits$}] — {}.",
        verdict(&met)
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_on_a_figure_left_unmeasured_says_so_rather_than_not_met() {
        assert_eq!(plain_of(&[f64::NAN, 144.0], false), "not measured");
        assert_eq!(plain_of(&[130.0, 144.0], true), "**met**");
        assert_eq!(plain_of(&[190.0, 144.0], false), "**not met**");
    }
}
