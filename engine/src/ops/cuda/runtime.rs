//! Opening a CUDA device: CubeCL's persistent caches first, then the device.
//!
//! CubeCL keeps its autotune results and compiled kernels in one database
//! under a directory; it must be pointed there before anything touches
//! CubeCL, so that a restart reuses both (`--kernel-cache-dir`).

use std::path::Path;

use burn::prelude::*;

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
    if CubeClRuntimeConfig::try_set(config) {
        tracing::info!(dir = %dir.display(), "kernel and autotune cache");
    } else {
        cubecl::environment::set_root(dir);
        tracing::warn!(dir = %dir.display(), "CubeCL was configured before the cache directory was set; only the autotune cache uses it");
    }
}

/// Burn's CUDA device `index` (nothing runs until its first use).
pub fn device(index: usize) -> Device {
    Device::cuda(index)
}
