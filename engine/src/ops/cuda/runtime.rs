//! Opening a CUDA device: CubeCL's persistent caches first, then the device.
//!
//! CubeCL keeps its autotune results and compiled kernels in one database
//! under a directory; it must be pointed there before anything touches
//! CubeCL, so that a restart reuses both (`--kernel-cache-dir`). Compiled
//! kernels and tuning results belong to one GPU model, driver and NVRTC, so
//! each combination gets its own subdirectory ([`cache_key`], read from the
//! driver before CubeCL starts): a cache prepared on another GPU (or copied
//! into an image built elsewhere) is never used, only ignored. Ember's own
//! projection timings live there too ([`kernel_cache_dir`]).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use burn::prelude::*;

/// The directory [`set_kernel_cache_dir`] pointed CubeCL at, once set.
static KERNEL_CACHE_DIR: OnceLock<PathBuf> = OnceLock::new();

/// The kernel cache directory of this process ([`set_kernel_cache_dir`];
/// `None` before, or without one): Ember keeps its own projection timings
/// there too (`crate::ops::tune_record`), beside CubeCL's autotune results,
/// with the same lifetime and the same key (GPU, driver, NVRTC, version).
pub fn kernel_cache_dir() -> Option<PathBuf> {
    KERNEL_CACHE_DIR.get().cloned()
}

/// Points CubeCL's persistent caches (autotune results and compiled kernels)
/// at `dir`. Must run before anything touches CubeCL; if something did, only
/// the autotune cache follows (logged as a warning).
pub fn set_kernel_cache_dir(dir: &Path) {
    use cubecl::config::cache::CacheConfig;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    if let Err(e) = std::fs::create_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot create the kernel cache directory; kernels will be compiled and tuned again at every start");
        return;
    }
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    config.environment.path = CacheConfig::Directory(dir.to_path_buf());
    config.compilation.cache = true;
    announce_compilations(&mut config);
    if CubeClRuntimeConfig::try_set(config) {
        tracing::info!(dir = %dir.display(), "kernel and autotune cache");
    } else {
        cubecl::environment::set_root(dir);
        tracing::warn!(dir = %dir.display(), "CubeCL was configured before the cache directory was set; only the autotune cache uses it");
    }
    // The first directory wins, as CubeCL's configuration does.
    let _ = KERNEL_CACHE_DIR.set(dir.to_path_buf());
}

/// Has CubeCL announce each kernel it compiles (not one loaded from the
/// cache) with one `log` line at INFO, target [`COMPILATION_TARGET`],
/// `[Compiling kernel] <name>`: the server counts them before and after
/// SERVING (its autotune watch), as it counts tunings. Left as configured
/// when something already asks for more (`CUBECL_DEBUG_LOG`, a
/// `cubecl.toml`).
fn announce_compilations(config: &mut cubecl::config::CubeClRuntimeConfig) {
    use cubecl::config::compilation::CompilationLogLevel;
    use cubecl_environment::config::logger::LogCrateLevel;
    let logger = &mut config.compilation.logger;
    if matches!(logger.level, CompilationLogLevel::Disabled) {
        logger.level = CompilationLogLevel::Basic;
    }
    logger.log.get_or_insert(LogCrateLevel::Info);
}

/// Where CubeCL logs each compilation from ([`set_kernel_cache_dir`]).
pub const COMPILATION_TARGET: &str = "cubecl::compilation";

/// `(free, total)` bytes of CUDA device `index`'s memory, from the driver
/// (everything on the device counts: this process's pool, other processes).
pub fn memory_info(index: usize) -> Result<(usize, usize), String> {
    let ctx = cudarc::driver::CudaContext::new(index).map_err(|e| format!("cuCtx: {e:?}"))?;
    ctx.mem_get_info()
        .map_err(|e| format!("cuMemGetInfo: {e:?}"))
}

/// Burn's CUDA device `index` (nothing runs until its first use).
pub fn device(index: usize) -> Device {
    Device::cuda(index)
}

/// The kernel cache's subdirectory for CUDA device `index`: the GPU's name
/// and compute capability, the driver's and NVRTC's versions, and Ember's
/// (its kernels change between versions), e.g.
/// `NVIDIA H200-sm90-driver13000-nvrtc13.0-ember0.1.0` (the caller makes it
/// a safe file name).
pub fn cache_key(index: usize) -> Result<String, String> {
    let read = || -> Result<String, String> {
        use cudarc::driver::{result, sys};
        result::init().map_err(|e| format!("cuInit: {e:?}"))?;
        let dev = result::device::get(index as i32).map_err(|e| format!("cuDeviceGet: {e:?}"))?;
        let name = result::device::get_name(dev).map_err(|e| format!("cuDeviceGetName: {e:?}"))?;
        let attr = |a| {
            // Safety: a valid device and a compute-capability attribute.
            unsafe { result::device::get_attribute(dev, a) }
                .map_err(|e| format!("cuDeviceGetAttribute: {e:?}"))
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let mut driver = 0;
        // Safety: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut driver) };
        let (mut nv_major, mut nv_minor) = (0, 0);
        // Safety: writes two ints.
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut nv_major, &mut nv_minor) };
        Ok(format!(
            "{name}-sm{major}{minor}-driver{driver}-nvrtc{nv_major}.{nv_minor}-ember{}",
            env!("CARGO_PKG_VERSION")
        ))
    };
    // The dynamic loaders panic when a library is missing.
    std::panic::catch_unwind(read)
        .map_err(|_| "the CUDA driver or NVRTC could not be loaded".to_string())?
}
