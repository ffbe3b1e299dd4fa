//! Messages refused for size before a handler runs, counted and named.
//!
//! tonic checks a request's size while decoding it, before the handler is called: a frame
//! longer than the limit gets `OUT_OF_RANGE`, and a compressed one that inflates past it
//! gets `RESOURCE_EXHAUSTED`, each with tonic's own words and no mention of the setting
//! that sets the limit. No handler runs, so no handler can count it either.
//!
//! [`SizeLimitLayer`] wraps a server's routes. It recognises those two refusals in the
//! response (they are trailers-only, so the status is in the headers), reports each with
//! its method to a callback (the process's counter), and rewrites it to one
//! `RESOURCE_EXHAUSTED` that names the limit and the setting, as every other bound does
//! (DESIGN §8). Nothing else is touched: a handler's own statuses pass through.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::http;
use tonic::{Code, Status};

/// Called with the gRPC path (`/hourglass.v1.Collector/Push`) of each refused request.
pub type OnRefusal = Arc<dyn Fn(&str) + Send + Sync>;

/// A tower layer that counts and renames tonic's message-size refusals.
#[derive(Clone)]
pub struct SizeLimitLayer {
    limit: usize,
    setting: &'static str,
    on_refusal: OnRefusal,
}

impl SizeLimitLayer {
    /// Refusals of messages over `limit` bytes, set by `setting` (`limits.max_message_mib`),
    /// reported to `on_refusal`.
    pub fn new(limit: usize, setting: &'static str, on_refusal: OnRefusal) -> Self {
        SizeLimitLayer {
            limit,
            setting,
            on_refusal,
        }
    }

    /// The status a refusal becomes, if `status` is one of tonic's size refusals.
    fn rename(&self, status: &Status) -> Option<Status> {
        let message = status.message();
        let too_long = status.code() == Code::OutOfRange
            && message.starts_with("Error, decoded message length too large");
        let inflates = status.code() == Code::ResourceExhausted
            && message.starts_with("Error decompressing: size limit");
        if !(too_long || inflates) {
            return None;
        }
        // tonic's wording carries the size it found, when it knows one: keep it.
        let found = message
            .split("found ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .map(|n| format!("{n} bytes, "))
            .unwrap_or_default();
        let form = if inflates { "decompressed, " } else { "" };
        Some(Status::resource_exhausted(format!(
            "request message is {found}{form}more than the limit of {} bytes ({})",
            self.limit, self.setting
        )))
    }
}

impl<S> tower::Layer<S> for SizeLimitLayer {
    type Service = SizeLimit<S>;

    fn layer(&self, inner: S) -> SizeLimit<S> {
        SizeLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`SizeLimitLayer`] makes.
#[derive(Clone)]
pub struct SizeLimit<S> {
    inner: S,
    layer: SizeLimitLayer,
}

impl<S, B, R> tower::Service<http::Request<B>> for SizeLimit<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path().to_owned();
        let response = self.inner.call(request);
        let layer = self.layer.clone();
        Box::pin(async move {
            let mut response = response.await?;
            let renamed = Status::from_header_map(response.headers())
                .and_then(|status| layer.rename(&status));
            if let Some(status) = renamed {
                (layer.on_refusal)(&path);
                tracing::warn!(method = path, "refused: {}", status.message());
                let headers = response.headers_mut();
                headers.remove(Status::GRPC_MESSAGE);
                if let Err(e) = status.add_header(headers) {
                    tracing::error!(error = %e, "cannot rewrite a size refusal's status");
                }
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn layer() -> (SizeLimitLayer, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let on_refusal: OnRefusal = Arc::new(move |path| sink.lock().unwrap().push(path.into()));
        (
            SizeLimitLayer::new(1 << 20, "limits.max_message_mib", on_refusal),
            seen,
        )
    }

    #[test]
    fn tonic_size_refusals_are_renamed_and_others_are_not() {
        let (layer, _) = layer();
        let too_long = Status::out_of_range(
            "Error, decoded message length too large: found 2097172 bytes, the limit is: 1048576 bytes",
        );
        let renamed = layer.rename(&too_long).unwrap();
        assert_eq!(renamed.code(), Code::ResourceExhausted);
        assert_eq!(
            renamed.message(),
            "request message is 2097172 bytes, more than the limit of 1048576 bytes (limits.max_message_mib)"
        );
        let inflates = Status::resource_exhausted(
            "Error decompressing: size limit, of 1048576 bytes, exceeded while decompressing message",
        );
        assert_eq!(
            layer.rename(&inflates).unwrap().message(),
            "request message is decompressed, more than the limit of 1048576 bytes (limits.max_message_mib)"
        );
        // A handler's own refusals, and other codes with tonic-like words, pass through.
        for status in [
            Status::resource_exhausted("push has 20000 snapshots, more than the limit"),
            Status::out_of_range("hour out of range"),
            Status::invalid_argument("Error, decoded message length too large"),
        ] {
            assert!(layer.rename(&status).is_none(), "{status:?}");
        }
    }

    #[tokio::test]
    async fn the_service_counts_and_rewrites_the_response() {
        use tower::{Layer, Service};
        let (layer, seen) = layer();
        let inner = tower::service_fn(|request: http::Request<()>| async move {
            let status = if request.uri().path().ends_with("Big") {
                Status::out_of_range(
                    "Error, decoded message length too large: found 9 bytes, the limit is: 1 bytes",
                )
            } else {
                Status::permission_denied("no")
            };
            Ok::<_, std::convert::Infallible>(status.into_http::<()>())
        });
        let mut service = layer.layer(inner);
        let call = |path: &str| http::Request::builder().uri(path).body(()).unwrap();
        let big = service.call(call("/p.S/Big")).await.unwrap();
        let status = Status::from_header_map(big.headers()).unwrap();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(
            status.message().contains("limits.max_message_mib"),
            "{status:?}"
        );
        let other = service.call(call("/p.S/Small")).await.unwrap();
        assert_eq!(
            Status::from_header_map(other.headers()).unwrap().code(),
            Code::PermissionDenied
        );
        assert_eq!(*seen.lock().unwrap(), vec!["/p.S/Big".to_string()]);
    }
}
