//! What an invocation does, one module per mode: [`run`] (the plain
//! benchmark, `loadgen [FLAGS]`; its sweeps in [`sweep`]), [`compare`]
//! (`loadgen compare`: several targets in turn, one report), [`calibrate`]
//! (`loadgen calibrate`, with the mock placed by [`mock_host`]) and [`mock`]
//! (`loadgen mock`). [`session`] is one benchmark session (connections,
//! workload, one run at a time) that every benchmarking mode drives, with
//! the settings of [`setup`];
//! [`spawn`] is `--spawn-server`; [`limits`] raises the open-file limit.

pub mod calibrate;
pub mod compare;
pub mod limits;
pub mod mock;
pub mod mock_host;
pub mod run;
pub mod session;
pub mod setup;
pub mod spawn;
pub mod sweep;
