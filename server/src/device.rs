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
//! The engine binary and the benchmark both open their device here.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::{FloatDType, IntDType};

use crate::cli::DeviceSpec;

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

/// Opens the device `spec` names. `kernel_cache_dir` is where CubeCL keeps
/// its autotune results and compiled kernels (CUDA only).
pub fn open(
    spec: DeviceSpec,
    kernel_cache_dir: Option<&Path>,
) -> Result<EngineDevice, DeviceError> {
    match spec {
        DeviceSpec::Cpu => open_cpu(),
        DeviceSpec::Cuda(index) => open_cuda(index, kernel_cache_dir),
        DeviceSpec::Auto => choose_auto(
            cfg!(feature = "cuda"),
            || open_cuda(0, kernel_cache_dir),
            open_cpu,
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

fn open_cpu() -> Result<EngineDevice, DeviceError> {
    let mut device = Device::flex();
    configure(&mut device, FloatDType::F32).map_err(|message| DeviceError::Configure {
        device: "cpu".into(),
        message,
    })?;
    Ok(EngineDevice {
        device,
        name: "cpu (Flex f32)".into(),
        float_bytes: 4,
        bucketed: false,
    })
}

#[cfg(feature = "cuda")]
fn open_cuda(index: usize, kernel_cache_dir: Option<&Path>) -> Result<EngineDevice, DeviceError> {
    if let Some(dir) = kernel_cache_dir {
        set_kernel_cache_dir(dir);
    }
    let device = probe(|| {
        let mut device = Device::cuda(index);
        configure(&mut device, FloatDType::F16)?;
        Ok(device)
    })
    .map_err(|reason| DeviceError::CudaUnavailable {
        device: format!("cuda:{index}"),
        reason,
    })?;
    Ok(EngineDevice {
        device,
        name: format!("cuda:{index} (CUDA f16)"),
        float_bytes: 2,
        bucketed: true,
    })
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(index: usize, _: Option<&Path>) -> Result<EngineDevice, DeviceError> {
    Err(DeviceError::NoCuda(format!("cuda:{index}")))
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

/// Points CubeCL's persistent caches (autotune results and compiled kernels,
/// one database file) at `dir`. Must run before anything touches CubeCL.
#[cfg(feature = "cuda")]
fn set_kernel_cache_dir(dir: &Path) {
    use cubecl::config::cache::CacheConfig;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    if let Err(e) = std::fs::create_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot create the kernel cache directory; kernels will be compiled and tuned again at every start");
        return;
    }
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    config.environment.path = CacheConfig::Directory(dir.to_path_buf());
    config.compilation.cache = true;
    if CubeClRuntimeConfig::try_set(config) {
        tracing::info!(dir = %dir.display(), "kernel and autotune cache");
    } else {
        cubecl::environment::set_root(dir);
        tracing::warn!(dir = %dir.display(), "CubeCL was configured before the cache directory was set; only the autotune cache uses it");
    }
}

/// Opens a device with `open` and runs one small kernel on it, checking the
/// result. The first use of a CUDA device loads the driver, creates the
/// context and compiles the kernel with NVRTC (which `#include`s the CUDA
/// headers), so a machine missing any of them fails here. Backends report
/// such failures by panicking (on this thread or on the device's runner
/// thread); the panic is caught and becomes the error, and its log line is a
/// warning, not an error (see [`crate::logging::expecting_panics`]).
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
    let outcome = crate::logging::expecting_panics(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
    });
    outcome.unwrap_or_else(|panic| {
        Err(format!(
            "the backend panicked: {}",
            crate::logging::panic_message(panic.as_ref())
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
        probe(|| Ok(open_cpu().unwrap().device)).unwrap();
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
        let err = open(DeviceSpec::Cuda(0), None).unwrap_err().to_string();
        assert!(err.contains("--device cuda:0"), "{err}");
        assert!(err.contains("without the `cuda` feature"), "{err}");
        assert_eq!(open(DeviceSpec::Auto, None).unwrap().name, "cpu (Flex f32)");
    }
}
