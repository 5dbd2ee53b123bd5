//! What the HTTP routes share: [`App`] (the one request path, the served
//! model name, the API keys) and the names of Ember's request headers. Below
//! every other file of the door, so none imports another one back.

use crate::service::auth::ApiKeys;
use crate::service::Frontend;

/// The header that sets a request's deadline, in seconds (`0.5`, `30`): the
/// same machinery as gRPC's `grpc-timeout`.
pub const DEADLINE_HEADER: &str = "x-request-timeout";

/// The header that sets a request's id (echoed back; in the log line and in
/// the response `id`).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// What the routes share.
pub struct App {
    /// The one request path.
    pub frontend: Frontend,
    /// The served model name (`model` in requests and responses).
    pub model_name: String,
    /// Keys the `/v1` routes ask for (none: open).
    pub keys: ApiKeys,
    /// Unix seconds at startup (`created` of the model in `/v1/models`).
    pub started: u64,
}
