//! Whether the sampling kernel runs on a device: asked once where the
//! per-row buffers and the penalty state are made, so the sampler and the
//! device state agree on it.

use burn::prelude::*;

/// Whether the sampling kernel serves `device` for `vocab` tokens (asked
/// where the buffers are made; the device's limit is read once).
/// `EMBER_DEVICE_SAMPLER=0` turns it off (every sampled row then goes through
/// the host sampler: a debugging aid, read once).
pub fn kernel_serves(device: &Device, vocab: usize) -> bool {
    #[cfg(feature = "cuda")]
    {
        static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let off =
            *OFF.get_or_init(|| std::env::var("EMBER_DEVICE_SAMPLER").is_ok_and(|v| v == "0"));
        !off && crate::ops::cuda::sample_rows_fit(device, vocab)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (device, vocab);
        false
    }
}
