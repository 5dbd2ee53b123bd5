//! Measuring runs: firing the requests on their schedule ([`runner`]) and
//! the wall and CPU clocks read around them ([`clock`]),
//! multi-turn sessions ([`session`]), the live view while they run
//! ([`progress`]), the server's metrics and the GPUs sampled meanwhile
//! ([`scrape`], [`gpu`]), and turning records into numbers:
//! distributions ([`dist`]), a run's distributions ([`metrics`]), a run's
//! statistics and the spread across runs ([`stats`]), per-target figures
//! ([`targets`]), goodput under SLOs ([`slo`]) and what a sweep found
//! ([`sweep`]). Nothing here prints: `report` does.

pub mod clock;
pub mod dist;
pub mod gpu;
pub mod metrics;
pub mod progress;
pub mod runner;
pub mod scrape;
pub mod session;
pub mod slo;
pub mod stats;
pub mod sweep;
pub mod targets;
