//! `loadgen compare`: the same workload against several targets in turn,
//! one report with the targets as series (`cli::compare` has the flags and
//! builds a [`SeriesPlan`] per `--series`).
//!
//! The series run one after another with the same seeds, so they get the
//! same prompts and arrival times. The text report prints each series' run
//! blocks, then one table with a row per series and run; `--json` has a
//! `series` list; `--report DIR` draws every series in the same charts.

use std::io::Write;

use crate::error::Error;
use crate::modes::run::{benchmark, outputs};
use crate::modes::session::Outcome;
use crate::modes::setup::{BenchConfig, Outputs};
use crate::report::json::RequestsOut;
use crate::report::tables;

/// One series: its name, its settings and its targets.
#[derive(Debug, Clone)]
pub struct SeriesPlan {
    /// The name in every report.
    pub name: String,
    /// Its settings (the shared flags with its connection flags on top).
    pub config: BenchConfig,
    /// Its target URLs.
    pub urls: Vec<String>,
}

/// Runs every series in turn, then prints the comparison table and writes
/// the combined outputs; `flags` is every flag, as written out.
pub async fn run(
    plan: Vec<SeriesPlan>,
    to: &Outputs,
    flags: &serde_json::Value,
) -> Result<Outcome, Error> {
    let mut requests_out = to
        .requests_out
        .as_deref()
        .map(RequestsOut::create)
        .transpose()?;
    let (mut series, mut outcome) = (Vec::with_capacity(plan.len()), Outcome::default());
    for (k, p) in plan.iter().enumerate() {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "### series {}/{}: {} ({}) ###",
            k + 1,
            plan.len(),
            p.name,
            p.config.conn.describe()
        )?;
        drop(stdout);
        let (s, o, out) = benchmark(&p.config, &p.urls, requests_out, Some(p.name.clone())).await?;
        requests_out = out;
        outcome.requests += o.requests;
        outcome.failed += o.failed;
        series.push(s);
    }
    let mut stdout = std::io::stdout().lock();
    tables::compare_table(&mut stdout, &series)?;
    drop(stdout);
    outputs(to, &series, flags, true)?;
    Ok(outcome)
}
