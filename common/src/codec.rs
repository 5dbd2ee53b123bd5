//! The server side's protobuf codec: tonic's prost codec, except that a
//! request that cannot be decoded gets INVALID_ARGUMENT.
//!
//! tonic-prost reports every decode failure as INTERNAL (the gRPC
//! status-code guide's choice for "error parsing a message"). For a server
//! that is the wrong signal: a request whose bytes are not a valid
//! `GenerateRequest` (a `prompt` that is not UTF-8, a truncated varint) is the
//! caller's error, must not be retried as is, and must not page whoever watches
//! the server's INTERNAL rate. The generated server code (see `build.rs`)
//! uses [`RequestCodec`]; the generated client keeps tonic's codec, so a
//! malformed *response* is still INTERNAL. prost's message names the message
//! and field, e.g. `failed to decode Protobuf message: GenerateRequest.prompt:
//! invalid string value: data is not UTF-8 encoded`.

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// [`ProstCodec`] with decode errors mapped to INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct RequestCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for RequestCodec<T, U> {
    fn default() -> Self {
        Self(ProstCodec::new())
    }
}

impl<T, U> Codec for RequestCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(self.0.decoder())
    }
}

/// [`ProstDecoder`] whose failures are the sender's fault.
#[derive(Debug, Clone)]
pub struct RequestDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| match status.code() {
            Code::Internal => Status::invalid_argument(status.message()),
            _ => status,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
