//! [`PendingStep`]: a decode step queued on the device and not yet judged,
//! which the overlapped step loop ([`super::decode`]) keeps between calls.

use crate::ops::PendingIds;
use crate::types::SeqId;

/// A decode step queued on the device and not yet judged.
pub(crate) struct PendingStep {
    /// Each row's sequence, with the serial of the admission it planned for.
    pub rows: Vec<(SeqId, u64)>,
    /// Its ids, on their way back.
    pub ids: PendingIds,
}
