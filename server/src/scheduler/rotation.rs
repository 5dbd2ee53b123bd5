//! Decode rotation: which decoding sequences the next decode step takes
//! when more decode than `--max-batch-size` allows in one step.
//!
//! Round robin over the engine's decoding sequences in id (arrival) order:
//! each step starts at the first id at or after the cursor the previous step
//! left (one past its last id), wrapping around, so every sequence gets a
//! turn at least once every `ceil(decoding / max_batch_size)` steps. With
//! fewer decoding sequences than a step holds, every one decodes every step.

use ember_engine::SeqId;

/// Up to `max` of `decoding` (ascending ids) starting at the first id at or
/// after `from`, wrapping around: one round-robin turn.
pub fn rotation(decoding: &[SeqId], from: SeqId, max: usize) -> Vec<SeqId> {
    let start = decoding.partition_point(|&id| id < from);
    decoding[start..]
        .iter()
        .chain(&decoding[..start])
        .take(max)
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::rotation;

    #[test]
    fn rotation_takes_turns_and_wraps() {
        let ids = [2, 5, 7, 9];
        assert_eq!(rotation(&ids, 0, 2), [2, 5]);
        assert_eq!(rotation(&ids, 6, 2), [7, 9]);
        assert_eq!(rotation(&ids, 8, 3), [9, 2, 5]);
        assert_eq!(rotation(&ids, 10, 8), [2, 5, 7, 9]);
        assert!(rotation(&[], 3, 4).is_empty());
    }
}
