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
//! - `auto`: CUDA when the binary has it and an NVIDIA device node exists,
//!   else the CPU.
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
}

/// Opens the device `spec` names. `kernel_cache_dir` is where CubeCL keeps
/// its autotune results and compiled kernels (CUDA only).
pub fn open(
    spec: DeviceSpec,
    kernel_cache_dir: Option<&Path>,
) -> Result<EngineDevice, DeviceError> {
    let spec = match spec {
        DeviceSpec::Auto if cuda_available() => DeviceSpec::Cuda(0),
        DeviceSpec::Auto => DeviceSpec::Cpu,
        other => other,
    };
    match spec {
        DeviceSpec::Cuda(index) => open_cuda(index, kernel_cache_dir),
        _ => open_cpu(),
    }
}

fn open_cpu() -> Result<EngineDevice, DeviceError> {
    let mut device = Device::flex();
    configure(&mut device, "cpu", FloatDType::F32)?;
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
    let mut device = Device::cuda(index);
    configure(&mut device, &format!("cuda:{index}"), FloatDType::F16)?;
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
fn configure(device: &mut Device, name: &str, float: FloatDType) -> Result<(), DeviceError> {
    match device.configure((float, IntDType::I32)) {
        Ok(()) => Ok(()),
        Err(_)
            if device.settings().float_dtype == float
                && device.settings().int_dtype == IntDType::I32 =>
        {
            Ok(())
        }
        Err(e) => Err(DeviceError::Configure {
            device: name.to_string(),
            message: format!("cannot set {float:?}/i32 as default dtypes: {e:?}"),
        }),
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

/// A cheap check for `--device auto`: built with CUDA and an NVIDIA device
/// node present.
fn cuda_available() -> bool {
    cfg!(feature = "cuda") && Path::new("/dev/nvidiactl").exists()
}
