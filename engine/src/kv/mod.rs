//! The KV cache's bookkeeping on the host: which blocks hold what.
//!
//! - [`blocks`]: the block pool (reference-counted blocks, all-or-nothing
//!   reservation of block tables, LRU eviction of cached blocks, the padding
//!   block every padding row reads and writes).
//! - [`prefix_cache`]: full blocks addressed by a chained hash of their
//!   prefix, and the LRU order of the ones no sequence holds.
//!
//! The K/V tensors themselves are the model's (`crate::model::KvCache`);
//! nothing here touches a device.

pub mod blocks;
pub mod prefix_cache;

pub use blocks::{slot_of, BlockPool};
pub use prefix_cache::BlockHash;
