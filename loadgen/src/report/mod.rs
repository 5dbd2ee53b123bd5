//! Reporting what was measured, never measuring: the text report on stdout
//! ([`text`] for a run's block, [`tables`] for sweeps, summaries, per-target
//! figures and compare series, both on [`fmt`]'s helpers), the `--json` and
//! `--requests-out` files ([`json`]), and the `--report DIR` HTML page
//! ([`html`], [`html_tables`], with [`charts`] as SVG). [`model`] is what they
//! all render: the session's setup and its series of runs.

pub mod charts;
pub mod fmt;
pub mod html;
pub mod html_tables;
pub mod json;
pub mod model;
pub mod tables;
pub mod text;
