//! Whether the sampling kernel runs on a device, and whether penalty counts
//! live there: decided once, from the kernel tuning's flags and the device,
//! where a runner is made, so its sampling buffers, its penalty state and
//! its sampler agree on it.

use burn::prelude::*;

use crate::tuning::KernelTuning;

/// Where a runner's sampled rows are sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceSampling {
    /// The sampling kernel chooses the tokens (CUDA, `--device-sampler`,
    /// the vocabulary's keys fit a block's shared memory); otherwise the
    /// host sampler does.
    pub kernel: bool,
    /// Penalty counts are device state the kernel reads (with `kernel`,
    /// `--device-penalties`); otherwise penalties are host edits.
    pub penalties: bool,
}

impl DeviceSampling {
    /// The choice for `device` and a vocabulary of `vocab` tokens under
    /// `tuning`'s switches (the device's limit is read here, once).
    pub fn of(tuning: &KernelTuning, device: &Device, vocab: usize) -> Self {
        let kernel = tuning.device_sampler && kernel_fits(device, vocab);
        Self {
            kernel,
            penalties: kernel && tuning.device_penalties,
        }
    }
}

/// Whether the sampling kernel can serve `device` for `vocab` tokens.
fn kernel_fits(device: &Device, vocab: usize) -> bool {
    #[cfg(feature = "cuda")]
    {
        crate::ops::cuda::sample_rows_fit(device, vocab)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (device, vocab);
        false
    }
}
