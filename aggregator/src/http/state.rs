//! What the handlers share (the query service and the tokens that guard it), and who
//! calls: the connection's peer and the request's token or certificate, checked.

use axum::extract::connect_info::ConnectInfo;
use axum::http::request::Parts;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::error::ApiError;
use crate::auth::Auth;
use crate::service::QueryService;

/// What the handlers share: the query service and the tokens that guard it.
pub(crate) struct HttpState {
    /// The `Query` service, as the gRPC server runs it.
    pub(crate) query: QueryService,
    /// The tokens and certificates that may query.
    pub(crate) auth: Auth,
}

/// What a connection tells the auth check, as tonic's own server records it for a gRPC
/// call: the addresses, and under TLS the client's certificates.
#[derive(Debug, Clone)]
pub(crate) enum Peer {
    /// A plaintext connection.
    Plain(TcpConnectInfo),
    /// A TLS connection.
    Tls(TlsConnectInfo<TcpConnectInfo>),
}

impl Peer {
    /// Puts what the connection tells on `request`, where [`Auth::check`] (client
    /// certificates) and the service (addresses) look for it.
    fn describe(&self, request: &mut tonic::Request<()>) {
        let extensions = request.extensions_mut();
        match self {
            Peer::Plain(info) => {
                extensions.insert(info.clone());
            }
            Peer::Tls(info) => {
                extensions.insert(info.clone());
            }
        }
    }
}

/// The caller of an API request, checked: the request's headers as gRPC metadata, and the
/// principal [`Auth::check`] found, ready to be the metadata and extensions of the
/// service's request.
pub(crate) fn caller(
    auth: &Auth,
    request: &Parts,
) -> Result<(tonic::metadata::MetadataMap, tonic::Extensions), ApiError> {
    let mut headers = axum::http::Request::new(());
    *headers.headers_mut() = request.headers.clone();
    let mut call = tonic::Request::from_http(headers);
    if let Some(ConnectInfo(peer)) = request.extensions.get::<ConnectInfo<Peer>>() {
        peer.describe(&mut call);
    }
    let checked = auth.check(crate::auth::Service::Query, call)?;
    let (metadata, extensions, ()) = checked.into_parts();
    Ok((metadata, extensions))
}
