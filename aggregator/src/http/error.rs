//! A failure as the API answers it: JSON with the gRPC code's name and its message, and
//! the HTTP status of that code.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The content type of JSON answers.
pub(crate) const JSON: &str = "application/json";

/// A failure as the API answers it: an HTTP status and `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: String) -> ApiError {
        ApiError {
            status,
            code,
            message,
        }
    }

    /// A bad query string: 400, INVALID_ARGUMENT.
    pub(crate) fn invalid(message: String) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message)
    }
}

impl From<tonic::Status> for ApiError {
    /// The HTTP status of each gRPC code; the message is the status's, unchanged.
    fn from(status: tonic::Status) -> ApiError {
        use tonic::Code;
        let http = match status.code() {
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(
            http,
            grpc_code_name(status.code()),
            status.message().to_string(),
        )
    }
}

/// The name of a gRPC code as the gRPC specification writes it: `INVALID_ARGUMENT`.
fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": {"code": self.code, "message": self.message}
        });
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, JSON)],
            body.to_string(),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_map_to_their_http_statuses() {
        use tonic::Code;
        for (code, status) in [
            (Code::InvalidArgument, 400),
            (Code::FailedPrecondition, 400),
            (Code::Unauthenticated, 401),
            (Code::PermissionDenied, 403),
            (Code::NotFound, 404),
            (Code::ResourceExhausted, 429),
            (Code::Unavailable, 503),
            (Code::DeadlineExceeded, 504),
            (Code::Internal, 500),
            (Code::Unknown, 500),
            (Code::DataLoss, 500),
        ] {
            let e = ApiError::from(tonic::Status::new(code, "why"));
            assert_eq!(e.status.as_u16(), status, "{code:?}");
            assert_eq!(e.message, "why");
            assert_eq!(
                e.code.to_ascii_lowercase(),
                hourglass_rpc::proto::code_label(code)
            );
        }
    }
}
