//! `--gpu-telemetry`: the local GPUs' utilization, memory, power and SM
//! clock through NVML (`nvml-wrapper`, which loads `libnvidia-ml` at run
//! time). Without NVML (no driver, no GPU) [`Gpus::open`] says why, and the
//! report carries that note instead of samples: never an error.

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::Nvml;
use serde::Serialize;

/// One GPU at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuSample {
    /// NVML's device index.
    pub gpu: u32,
    /// Percent of the last sample period a kernel ran.
    pub util_pct: Option<u32>,
    /// Device memory in use, MiB.
    pub memory_used_mib: Option<f64>,
    /// Power draw, W.
    pub power_w: Option<f64>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
}

/// NVML, opened once per run.
pub struct Gpus {
    /// The library handle.
    nvml: Nvml,
    /// Devices found.
    count: u32,
}

impl std::fmt::Debug for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpus({})", self.count)
    }
}

impl Gpus {
    /// Loads NVML and counts the devices, or says why not (the note).
    pub fn open() -> Result<Gpus, String> {
        let nvml = Nvml::init().map_err(|e| format!("NVML not available: {e}"))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML found no devices: {e}"))?;
        if count == 0 {
            return Err("NVML found no devices".into());
        }
        Ok(Gpus { nvml, count })
    }

    /// Every device now (a reading that fails is left out of its sample).
    pub fn sample(&self) -> Vec<GpuSample> {
        (0..self.count)
            .filter_map(|i| {
                let d = self.nvml.device_by_index(i).ok()?;
                Some(GpuSample {
                    gpu: i,
                    util_pct: d.utilization_rates().ok().map(|u| u.gpu),
                    memory_used_mib: d.memory_info().ok().map(|m| m.used as f64 / 1048576.0),
                    power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1e3),
                    sm_clock_mhz: d.clock_info(Clock::SM).ok(),
                })
            })
            .collect()
    }
}
