//! [`PendingIds`]: a step's chosen ids on their way back to the host, so the
//! host can queue the next step before it waits for them.
//!
//! On CUDA the device->host copy of the `[B, 1]` ids is queued on the engine
//! thread's stream right behind the step ([`super::cuda::readback`]: into
//! pinned memory, with a fence), and [`PendingIds::wait`] blocks on that
//! fence only when the host needs the values, typically after it queued the
//! next step (the overlapped step loop, `crate::engine::overlap`). Anywhere
//! else (the CPU, where every op has run by the time it returns) the ids are
//! read at once and `wait` hands them over.

use burn::prelude::*;

/// A step's chosen ids, read back or being read back (module docs).
pub enum PendingIds {
    /// Already on the host.
    Ready(Vec<u32>),
    /// A copy queued on the CUDA stream.
    #[cfg(feature = "cuda")]
    Queued(super::cuda::readback::QueuedRead),
}

impl std::fmt::Debug for PendingIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ready(ids) => f.debug_tuple("Ready").field(ids).finish(),
            #[cfg(feature = "cuda")]
            Self::Queued(_) => f.write_str("Queued"),
        }
    }
}

impl PendingIds {
    /// Starts reading the first `real` ids of `ids` (`[B, 1]`): a queued
    /// copy on CUDA, a read now elsewhere. The error is the device's.
    pub fn start(ids: Tensor<2, Int>, real: usize) -> Result<Self, String> {
        #[cfg(feature = "cuda")]
        if let Some(queued) = super::cuda::readback::QueuedRead::start(&ids, real) {
            return Ok(Self::Queued(queued));
        }
        let data = ids.try_into_data().map_err(|e| format!("{e:?}"))?;
        Ok(Self::Ready(
            data.iter::<i64>()
                .take(real)
                .map(|x| x.clamp(0, u32::MAX as i64) as u32)
                .collect(),
        ))
    }

    /// The ids, waiting for the copy if it is still running. The error is
    /// the device's.
    pub fn wait(self) -> Result<Vec<u32>, String> {
        match self {
            Self::Ready(ids) => Ok(ids),
            #[cfg(feature = "cuda")]
            Self::Queued(queued) => queued.wait(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_reads_the_real_rows_at_once() {
        let dev = Device::flex();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(vec![4i32, 9, 0, 0], [4, 1]), &dev);
        let pending = PendingIds::start(ids, 2).unwrap();
        assert!(matches!(pending, PendingIds::Ready(_)));
        assert_eq!(pending.wait().unwrap(), [4, 9]);
    }
}
