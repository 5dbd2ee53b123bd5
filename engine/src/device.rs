//! Choosing and configuring the device the engine runs on.
//!
//! - `cpu`: Burn's Flex backend in f32. Measured on x86 (see
//!   docs/performance.md): Flex runs f16 element-wise ops one element at a
//!   time through f32 and packs f16 matmul operands into f32, so f16 is slower
//!   there; 32-bit ints.
//! - `cuda[:N]`: Burn's CUDA backend (fusion, autotune) in f16 with 32-bit
//!   ints, step shapes bucketed. Before the first CubeCL call the autotune and
//!   compiled-kernel caches are pointed at `--kernel-cache-dir`, so a restart
//!   reuses them.
//! - `auto`: CUDA device 0 when the binary has CUDA and CUDA starts, else the
//!   CPU, with a warning saying why CUDA did not start ([`choose_auto`]). A
//!   CPU-only build goes straight to the CPU.
//!
//! "CUDA starts" is checked by [`probe`]: one small kernel is compiled (NVRTC,
//! which needs the CUDA headers), run and read back, which is everything the
//! engine will need from the machine (driver, context, NVRTC, headers). A
//! missing piece fails there, with its reason, instead of as a panic in the
//! middle of loading the model; `--device cuda[:N]` then fails at startup
//! naming the flag, `--device auto` falls back.
//!
//! The kernel knobs ([`KernelTuning`]) are read here, once, and so is the
//! CPU's instruction set ([`CpuKernels`]): the device carries them to every
//! op as [`Ops`]. The server and the benchmark both
//! open their device here.

use std::path::PathBuf;
use std::str::FromStr;

use burn::prelude::*;
use burn::tensor::{FloatDType, IntDType};

use crate::cpu_tuning::CpuTuning;
use crate::ops::cpu::isa::simd_flags;
use crate::ops::{CpuKernels, Ops};
use crate::panics::{expecting_panics, panic_message};
use crate::tuning::KernelTuning;

/// Where the engine runs (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// CUDA device 0 if the binary has CUDA and it starts, else the CPU
    /// ([`choose_auto`]).
    Auto,
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| format!("--device must be auto, cpu, cuda or cuda:N, got {s:?}")),
        }
    }
}

/// How to set a device up, besides which one it is.
#[derive(Debug, Clone, Default)]
pub struct DeviceOptions {
    /// Where CubeCL keeps its autotune results and compiled kernels (CUDA).
    pub kernel_cache_dir: Option<PathBuf>,
    /// The CUDA kernels' knobs (validated).
    pub tuning: KernelTuning,
    /// The CPU kernels' knobs.
    pub cpu: CpuTuning,
}

/// A configured device and what the engine needs to know about it.
#[derive(Debug, Clone)]
pub struct EngineDevice {
    pub device: Device,
    /// For logs and `GetServerInfo`, e.g. `cuda:0 (CUDA f16)`.
    pub name: String,
    /// Bytes of one float element (KV sizing).
    pub float_bytes: usize,
    /// Whether the engine pads step shapes to buckets (CUDA).
    pub bucketed: bool,
    /// The ops every model layer runs through, with the kernel knobs.
    pub ops: Ops,
    /// The CUDA device's index (`None` on the CPU), for memory queries.
    pub cuda_index: Option<usize>,
}

/// What a device has, in bytes (KV sizing: `crate::engine::kv_sizing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceMemory {
    /// A GPU: its total memory and what is free now (whoever uses the rest).
    Gpu { total: usize, free: usize },
    /// The host: RAM available now (`MemAvailable`).
    Host { available: usize },
}

impl EngineDevice {
    /// What the device has now, or `None` if it cannot be read (logged).
    pub fn memory(&self) -> Option<DeviceMemory> {
        let read = match self.cuda_index {
            #[cfg(feature = "cuda")]
            Some(index) => crate::ops::cuda::runtime::memory_info(index)
                .map(|(free, total)| DeviceMemory::Gpu { total, free }),
            #[cfg(not(feature = "cuda"))]
            Some(_) => Err("no CUDA in this build".to_string()),
            None => host_available().map(|available| DeviceMemory::Host { available }),
        };
        read.inspect_err(|reason| tracing::warn!(%reason, "cannot read the device's memory"))
            .ok()
    }

    /// The CPU (Flex, f32) with the default knobs: never fails unless the
    /// dtypes cannot be set.
    pub fn cpu() -> Result<Self, DeviceError> {
        open_cpu(CpuTuning::default())
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn host_available() -> Result<usize, String> {
    let text =
        std::fs::read_to_string("/proc/meminfo").map_err(|e| format!("/proc/meminfo: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| "/proc/meminfo has no MemAvailable".to_string())
}

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("--device {0}: this binary was built without the `cuda` feature")]
    NoCuda(String),
    #[error("--device {device}: {message}")]
    Configure { device: String, message: String },
    #[error("--device {device}: CUDA cannot start: {reason}")]
    CudaUnavailable { device: String, reason: String },
}

/// `$XDG_CACHE_HOME/ember/kernels`, else `$HOME/.cache/ember/kernels`: the
/// default `--kernel-cache-dir`.
pub fn default_kernel_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("ember").join("kernels"))
}

/// Opens the device `spec` names, set up with `options`.
pub fn open(spec: DeviceSpec, options: &DeviceOptions) -> Result<EngineDevice, DeviceError> {
    match spec {
        DeviceSpec::Cpu => open_cpu(options.cpu),
        DeviceSpec::Cuda(index) => open_cuda(index, options),
        DeviceSpec::Auto => choose_auto(
            cfg!(feature = "cuda"),
            || open_cuda(0, options),
            || open_cpu(options.cpu),
        ),
    }
}

/// `--device auto`: the CPU in a build without CUDA (`cuda_built` false; CUDA
/// is not tried), else CUDA if `open_cuda` succeeds, else the CPU with a
/// warning that gives the reason.
pub fn choose_auto(
    cuda_built: bool,
    open_cuda: impl FnOnce() -> Result<EngineDevice, DeviceError>,
    open_cpu: impl FnOnce() -> Result<EngineDevice, DeviceError>,
) -> Result<EngineDevice, DeviceError> {
    if !cuda_built {
        return open_cpu();
    }
    match open_cuda() {
        Ok(device) => Ok(device),
        Err(err) => {
            tracing::warn!(
                reason = %err,
                "--device auto: this binary has CUDA but CUDA cannot start here; falling back to the CPU (README, \"Running on a GPU\", lists what CUDA needs)"
            );
            open_cpu()
        }
    }
}

fn open_cpu(tuning: CpuTuning) -> Result<EngineDevice, DeviceError> {
    let mut device = Device::flex();
    configure(&mut device, FloatDType::F32).map_err(|message| DeviceError::Configure {
        device: "cpu".into(),
        message,
    })?;
    // The CPU reads none of the CUDA knobs; its kernels' instruction set is
    // detected here, once.
    let cpu = CpuKernels::new(tuning);
    tracing::info!(isa = %cpu.isa, simd = %simd_flags(), weights = %cpu.weights, "CPU kernels");
    Ok(EngineDevice {
        device,
        name: "cpu (Flex f32)".into(),
        float_bytes: 4,
        bucketed: false,
        ops: Ops::cpu(cpu),
        cuda_index: None,
    })
}

/// CUDA device `index`: the kernel caches first, then the probe; the kernel
/// knobs are logged once here.
fn open_cuda(index: usize, options: &DeviceOptions) -> Result<EngineDevice, DeviceError> {
    #[cfg(feature = "cuda")]
    {
        use crate::ops::cuda::runtime;
        if let Some(dir) = &options.kernel_cache_dir {
            match runtime::cache_key(index) {
                Ok(key) => runtime::set_kernel_cache_dir(&dir.join(file_name_safe(&key))),
                // The probe below reports why CUDA cannot start.
                Err(reason) => tracing::debug!(%reason, "no kernel cache key"),
            }
        }
        let device = probe(|| {
            let mut device = runtime::device(index);
            configure(&mut device, FloatDType::F16)?;
            Ok(device)
        })
        .map_err(|reason| DeviceError::CudaUnavailable {
            device: format!("cuda:{index}"),
            reason,
        })?;
        tracing::info!(tuning = %options.tuning, "CUDA kernel tuning");
        let cublaslt = options.tuning.cublaslt && cublaslt_usable();
        Ok(EngineDevice {
            device,
            name: format!("cuda:{index} (CUDA f16)"),
            float_bytes: 2,
            bucketed: true,
            ops: Ops::new(options.tuning).with_cublaslt(cublaslt),
            cuda_index: Some(index),
        })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = options;
        Err(DeviceError::NoCuda(format!("cuda:{index}")))
    }
}

/// Whether cuBLASLt can be loaded; logs why not (the projections then stay
/// on CubeCL's kernels).
#[cfg(feature = "cuda")]
fn cublaslt_usable() -> bool {
    match crate::ops::cuda::cublaslt::available() {
        Ok(()) => {
            tracing::info!("projections may run on cuBLASLt (libcublasLt found)");
            true
        }
        Err(reason) => {
            tracing::warn!(%reason, "cuBLASLt is not available: every projection runs on CubeCL's kernels, slower for prefill and large batches");
            false
        }
    }
}

/// `key` with every character but ASCII letters, digits, `.`, `_` and `-`
/// replaced by `-` (a kernel cache subdirectory's name).
pub fn file_name_safe(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Sets the device's default dtypes; a second open of the same device in one
/// process (tests start several servers) finds them already set, which is fine
/// as long as they are the ones wanted.
fn configure(device: &mut Device, float: FloatDType) -> Result<(), String> {
    match device.configure((float, IntDType::I32)) {
        Ok(()) => Ok(()),
        Err(_)
            if device.settings().float_dtype == float
                && device.settings().int_dtype == IntDType::I32 =>
        {
            Ok(())
        }
        Err(e) => Err(format!("cannot set {float:?}/i32 as default dtypes: {e:?}")),
    }
}

/// Opens a device with `open` and runs one small kernel on it, checking the
/// result. The first use of a CUDA device loads the driver, creates the
/// context and compiles the kernel with NVRTC (which `#include`s the CUDA
/// headers), so a machine missing any of them fails here. Backends report
/// such failures by panicking (on this thread or on the device's runner
/// thread); the panic is caught and becomes the error, and its log line is a
/// warning, not an error (see [`expecting_panics`]).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn probe(open: impl FnOnce() -> Result<Device, String>) -> Result<Device, String> {
    let run = || -> Result<Device, String> {
        let device = open()?;
        let x = Tensor::<1>::from_floats([1.0, 2.0, 3.0], &device);
        let data = (x.clone() * x + 1.0)
            .try_into_data()
            .map_err(|e| format!("reading a test kernel's result back failed: {e:?}"))?;
        let values: Vec<f32> = data.iter::<f32>().collect();
        if values != [2.0, 5.0, 10.0] {
            return Err(format!(
                "a test kernel computed {values:?}, expected [2, 5, 10]"
            ));
        }
        Ok(device)
    };
    let outcome = expecting_panics(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)));
    outcome.unwrap_or_else(|panic| {
        Err(format!(
            "the backend panicked: {}",
            panic_message(panic.as_ref())
        ))
    })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn fake(name: &str) -> Result<EngineDevice, DeviceError> {
        Ok(EngineDevice {
            device: Device::flex(),
            name: name.into(),
            float_bytes: 4,
            bucketed: false,
            ops: Ops::default(),
            cuda_index: None,
        })
    }

    fn unavailable() -> Result<EngineDevice, DeviceError> {
        Err(DeviceError::CudaUnavailable {
            device: "cuda:0".into(),
            reason: "libcuda.so not found".into(),
        })
    }

    #[test]
    fn auto_without_cuda_built_is_the_cpu_and_never_tries_cuda() {
        let tried = Cell::new(false);
        let picked = choose_auto(
            false,
            || {
                tried.set(true);
                fake("cuda")
            },
            || fake("cpu"),
        )
        .unwrap();
        assert_eq!(picked.name, "cpu");
        assert!(!tried.get());
    }

    #[test]
    fn auto_with_cuda_that_starts_is_cuda() {
        let picked = choose_auto(true, || fake("cuda"), || fake("cpu")).unwrap();
        assert_eq!(picked.name, "cuda");
    }

    #[test]
    fn auto_with_cuda_that_cannot_start_falls_back_to_the_cpu() {
        let picked = choose_auto(true, unavailable, || fake("cpu")).unwrap();
        assert_eq!(picked.name, "cpu");
    }

    #[test]
    fn the_probe_passes_on_a_working_device() {
        probe(|| Ok(EngineDevice::cpu().unwrap().device)).unwrap();
    }

    #[test]
    fn the_probe_turns_a_failed_open_or_a_backend_panic_into_its_reason() {
        let err = probe(|| Err("libcuda.so.1: cannot open shared object file".into()));
        assert_eq!(
            err.unwrap_err(),
            "libcuda.so.1: cannot open shared object file"
        );
        let err = probe(|| panic!("Unable to dynamically load the \"cuda\" shared library"));
        assert_eq!(
            err.unwrap_err(),
            "the backend panicked: Unable to dynamically load the \"cuda\" shared library"
        );
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_build_without_cuda_refuses_cuda_and_opens_the_cpu_for_auto() {
        let options = DeviceOptions::default();
        let err = open(DeviceSpec::Cuda(0), &options).unwrap_err().to_string();
        assert!(err.contains("--device cuda:0"), "{err}");
        assert!(err.contains("without the `cuda` feature"), "{err}");
        assert_eq!(
            open(DeviceSpec::Auto, &options).unwrap().name,
            "cpu (Flex f32)"
        );
    }

    #[test]
    fn cache_keys_become_safe_file_names() {
        assert_eq!(
            file_name_safe("NVIDIA H200-sm90-driver13000-nvrtc13.0-ember0.1.0"),
            "NVIDIA-H200-sm90-driver13000-nvrtc13.0-ember0.1.0"
        );
        assert_eq!(file_name_safe("a/b\\c:d e"), "a-b-c-d-e");
    }

    #[test]
    fn device_specs() {
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert!("cuda:x"
            .parse::<DeviceSpec>()
            .unwrap_err()
            .contains("--device"));
    }
}
