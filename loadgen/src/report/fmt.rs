//! The text report's small formatting helpers, shared by the run block
//! (`report::text`) and the tables (`report::tables`).

use std::io::{self, Write};

use crate::measure::dist::DistSummary;

/// Width of the label column.
pub const LABEL: usize = 38;

/// What a server-side line says when no request carried a server timeline.
pub const NOT_REPORTED: &str = "not reported by this server";

/// One `Label:  value` line.
pub fn line(w: &mut impl Write, label: &str, value: impl std::fmt::Display) -> io::Result<()> {
    writeln!(w, "{:<LABEL$}{value}", format!("{label}:"))
}

/// "p50 / p95 / p99 ms" with 3 decimals, or "n/a" for an empty distribution.
pub fn pcts(d: &DistSummary) -> String {
    match (d.p50, d.p95, d.p99) {
        (Some(a), Some(b), Some(c)) => format!("{a:.3} / {b:.3} / {c:.3} ms"),
        _ => "n/a".to_string(),
    }
}

/// [`pcts`] padded, then a note in parentheses.
pub fn pcts_note(d: &DistSummary, note: &str) -> String {
    format!("{:<34}({note})", pcts(d))
}

/// "p50/p99" with one decimal, or "n/a".
pub fn two(d: &DistSummary) -> String {
    match (d.p50, d.p99) {
        (Some(a), Some(b)) => format!("{a:.1}/{b:.1}"),
        _ => "n/a".to_string(),
    }
}

/// A value with one decimal, or "n/a".
pub fn one(v: Option<f64>) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v:.1}"))
}
