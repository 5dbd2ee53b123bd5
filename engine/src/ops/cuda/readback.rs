//! The CUDA half of [`crate::ops::readback::PendingIds`]: a device->host
//! copy queued on the engine thread's stream, waited for later.
//!
//! CubeCL's `Client::read_async` does the work eagerly: it queues the copy
//! into pinned memory behind everything already on the stream (a step's
//! graph replay and its sampling) and records a fence; only awaiting the
//! returned future blocks, on that fence. Burn's `into_data_async` cannot be
//! used for this: it is an `async fn`, so nothing is queued until it is
//! polled, and its first poll waits.

use std::future::Future;
use std::pin::Pin;

use burn::prelude::*;
use burn::tensor::DType;
use burn_cubecl::CubeBackend;
use cubecl::client::Client;
use cubecl::server::ServerError;
use cubecl_common::bytes::Bytes;

type Read = Pin<Box<dyn Future<Output = Result<Vec<Bytes>, ServerError>> + Send>>;

/// A queued copy of a step's ids (module docs).
pub struct QueuedRead {
    /// Declared first: dropped before the client it may borrow.
    read: Read,
    /// The client the read was queued on (boxed: its address is stable for
    /// as long as `read` lives, whatever moves this struct).
    _client: Box<Client>,
    dtype: DType,
    real: usize,
}

impl QueuedRead {
    /// Queues the copy of `ids` (an int tensor on CUDA; `None` elsewhere),
    /// of which the first `real` rows will be kept.
    pub fn start(ids: &Tensor<2, Int>, real: usize) -> Option<Self> {
        let fused = ids
            .clone()
            .try_into_primitive::<burn::backend::Cube>()
            .ok()?;
        let client = fused.client.clone();
        // Runs the queued work that produces the ids (fusion), so the copy
        // goes behind it.
        let cube = client.resolve_tensor_int::<CubeBackend>(fused);
        if !cube.is_contiguous() {
            return None;
        }
        let dtype = cube.dtype;
        let owner = Box::new(cube.client.clone());
        let read = owner.read_async(vec![cube.handle.clone()]);
        let read: Pin<Box<dyn Future<Output = Result<Vec<Bytes>, ServerError>> + Send + '_>> =
            Box::pin(read);
        // Safety: the future may borrow `*owner` (edition 2024 captures
        // `&self`), which lives on the heap, is never moved or mutated, and is
        // dropped after `read` (field order). Only the lifetime is erased.
        let read: Read = unsafe { std::mem::transmute(read) };
        Some(Self {
            read,
            _client: owner,
            dtype,
            real,
        })
    }

    /// Waits for the copy and decodes the first `real` ids.
    pub fn wait(self) -> Result<Vec<u32>, String> {
        let Self {
            read, dtype, real, ..
        } = self;
        let bytes = cubecl_environment::future::reader::read_sync(read)
            .map_err(|e| format!("reading a step's ids back: {e:?}"))?;
        let bytes = bytes
            .first()
            .ok_or_else(|| "a step's ids read back as nothing".to_string())?;
        let ids: Vec<u32> = match dtype {
            DType::I32 => bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]).max(0) as u32)
                .collect(),
            DType::I64 => bytes
                .chunks_exact(8)
                .map(|c| {
                    let v = i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                    v.clamp(0, u32::MAX as i64) as u32
                })
                .collect(),
            DType::U32 => bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            other => return Err(format!("a step's ids came back as {other:?}")),
        };
        if ids.len() < real {
            return Err(format!(
                "a step's ids read back {} of {real} rows",
                ids.len()
            ));
        }
        Ok(ids.into_iter().take(real).collect())
    }
}
