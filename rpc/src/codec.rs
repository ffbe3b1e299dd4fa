//! The gRPC codec of every service: prost messages, as `tonic_prost::ProstCodec` encodes
//! them, decoded from the received message as one contiguous [`Bytes`] rather than
//! through tonic's buffer view.
//!
//! prost reads a message field by field through the `Buf` it is given, a varint at a time
//! for every value of a packed repeated field (an Ingest batch's per-event times). Over
//! tonic's `DecodeBuf` each read is a bounds-checked view over a `BytesMut` whose
//! `advance` is not free; over `Bytes` it is a slice and a pointer bump. Taking the
//! message as `Bytes` costs nothing (it is split off the receive buffer, not copied), and
//! its `bytes` fields (`packed_items`, pushed sketches) stay slices of it as before.

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::{Buf, Bytes};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstEncoder};

/// The codec the generated services and clients use (`build.rs`).
#[derive(Debug, Clone)]
pub struct BytesCodec<T, U> {
    _messages: PhantomData<(T, U)>,
}

impl<T, U> Default for BytesCodec<T, U> {
    fn default() -> Self {
        BytesCodec {
            _messages: PhantomData,
        }
    }
}

impl<T, U> Codec for BytesCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = BytesDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesDecoder {
            _message: PhantomData,
        }
    }
}

/// Decodes a `U` from the whole message taken as [`Bytes`].
#[derive(Debug, Clone)]
pub struct BytesDecoder<U> {
    _message: PhantomData<U>,
}

impl<U: Message + Default> Decoder for BytesDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let message: Bytes = buf.copy_to_bytes(buf.remaining());
        // As tonic_prost does: a message that does not parse is INTERNAL, per
        // https://github.com/grpc/grpc/blob/master/doc/statuscodes.md
        U::decode(message)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
