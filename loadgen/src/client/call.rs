//! Sends one request on the connection the pool picked for it and returns
//! its record; the lease (the in-flight counts) is held until the stream
//! ends.

use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::client::pool::{Lease, Transport};
use crate::record::{RequestRecord, Slot};
use crate::workload::PreparedRequest;

/// Runs one request to its end. `submitted` receives the instant the call
/// returned its response stream (the relative schedule waits for it).
pub async fn execute(
    lease: Lease,
    prepared: PreparedRequest,
    slot: Slot,
    timeout: Duration,
    submitted: Option<oneshot::Sender<Instant>>,
) -> RequestRecord {
    let conn = &lease.conn;
    let record = match &conn.transport {
        Transport::Grpc(g) => {
            g.execute(
                &conn.target,
                conn.channel,
                prepared,
                slot,
                timeout,
                submitted,
            )
            .await
        }
        Transport::Http(h) => {
            h.execute(conn.channel, prepared, slot, timeout, submitted)
                .await
        }
    };
    drop(lease);
    record
}
