//! Per-device cuBLASLt state: the library handle, the workspace and the plan
//! cache, and the first error a queued GEMM met.
//!
//! The GEMM tasks run on CubeCL's device thread, the workspace is allocated
//! from the engine thread (a CubeCL buffer, so its memory is CubeCL's and
//! lives as long as the process), so the state sits in a process-wide map
//! keyed by device, behind a mutex only those two threads take.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use cubecl::server::Handle;
use cubecl_common::device::DeviceId;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

use super::plans::Plan;
use crate::ops::choice::PlanCache;

/// One device's cuBLASLt objects.
pub(super) struct LtDevice {
    /// Made on the device thread at the first GEMM (`None` until then).
    pub handle: Option<sys::cublasLtHandle_t>,
    /// The workspace buffer (allocated before any graph capture; never freed).
    pub workspace: Handle,
    pub plans: PlanCache<Plan>,
}

// Safety: the handle is only used under the registry's lock.
unsafe impl Send for LtDevice {}

impl LtDevice {
    /// The library handle, made on first use (on the device thread, whose
    /// CUDA context is current).
    pub fn handle(&mut self) -> Result<sys::cublasLtHandle_t, String> {
        if let Some(h) = self.handle {
            return Ok(h);
        }
        let h = lt::create_handle().map_err(|e| format!("cublasLtCreate: {e:?}"))?;
        self.handle = Some(h);
        Ok(h)
    }
}

fn registry() -> MutexGuard<'static, HashMap<DeviceId, LtDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<DeviceId, LtDevice>>> = OnceLock::new();
    DEVICES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// The device's workspace, allocated with `allocate` the first time.
pub(super) fn workspace(device: DeviceId, allocate: impl FnOnce() -> Handle) -> Handle {
    let mut devices = registry();
    devices
        .entry(device)
        .or_insert_with(|| LtDevice {
            handle: None,
            workspace: allocate(),
            plans: PlanCache::default(),
        })
        .workspace
        .clone()
}

/// Runs `f` with the device's state (`None` if no GEMM was set up on it).
pub(super) fn with_device<R>(device: DeviceId, f: impl FnOnce(&mut LtDevice) -> R) -> Option<R> {
    registry().get_mut(&device).map(f)
}

/// The first error a queued GEMM met since the last call, if any.
static FIRST_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Records a GEMM task's failure (the first one wins until taken).
pub(super) fn record_error(message: String) {
    tracing::error!(%message, "a cuBLASLt GEMM failed");
    let mut slot = FIRST_ERROR.lock().unwrap_or_else(PoisonError::into_inner);
    slot.get_or_insert(message);
}

/// Takes the first error a queued cuBLASLt GEMM met since the last call: the
/// engine checks it after each step, whose results are wrong if one failed.
pub fn take_error() -> Option<String> {
    FIRST_ERROR
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
}
