//! The gRPC side of the aggregator: the `Collector` and `Query` services (thin
//! translations between proto and the write path, the store and the planner, or, in
//! cluster mode, the cluster), the standard health service, server reflection, and the
//! server that carries them with compression and size limits.

mod collector;
mod query;

use std::future::Future;
use std::sync::Arc;

use hourglass_rpc::proto::v1::collector_server::CollectorServer;
use hourglass_rpc::proto::v1::peer_server::PeerServer;
use hourglass_rpc::proto::v1::query_server::QueryServer;
use tokio::net::TcpListener;
use tonic::codec::CompressionEncoding;

use crate::config::LimitsConfig;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::write::Writer;
pub(crate) use collector::CollectorService;
pub(crate) use query::QueryService;

pub(crate) use hourglass_rpc::proto::code_label as outcome_label;

/// How the gRPC port serves: bounds, who may call, and the transport.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// Bounds on requests.
    pub limits: LimitsConfig,
    /// How far back pushes may reach (`retention.hourly`).
    pub retention_hourly: std::time::Duration,
    /// A server silent this long stops counting as missing (`coverage.retire_after`).
    pub retire_after: std::time::Duration,
    /// Bearer tokens; none means no authentication.
    pub auth: crate::auth::Auth,
    /// TLS; plaintext when `None`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Cluster mode: pushes are published to the stream instead of stored here.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
}

/// `$server` (a generated gRPC server) with the codecs and size bound of the services
/// clients call, Collector and Query alike: gzip and zstd accepted, zstd sent where the
/// client takes it (else gzip), messages up to `$max` bytes each way. A macro, as each
/// generated server has these builders as its own methods, with no trait in common.
macro_rules! with_codecs {
    ($server:expr, $max:expr) => {
        $server
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Zstd)
            .send_compressed(CompressionEncoding::Zstd)
            .send_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size($max)
            .max_encoding_message_size($max)
    };
}

/// Serves every gRPC service on `listener` until `shutdown` completes, then stops
/// accepting and waits for the RPCs in flight.
pub async fn serve(
    listener: TcpListener,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let ServeOptions {
        limits,
        retention_hourly,
        retire_after,
        auth,
        tls,
        cluster,
    } = options;
    let max_message = limits.max_message_bytes();
    let writer = Writer::new(
        Arc::clone(&store),
        Arc::clone(&metrics),
        limits.clone(),
        retention_hourly,
    );
    let collector = CollectorService::new(writer).publishing_to(cluster.clone());
    let collector = with_codecs!(CollectorServer::new(collector), max_message);
    let query = with_codecs!(
        QueryServer::new(
            QueryService::new(Arc::clone(&store), Arc::clone(&metrics), limits)
                .retire_after(retire_after)
                .in_cluster(cluster.clone()),
        ),
        max_message
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    report_serving(&health).await;
    let mut builder = hourglass_rpc::tls::server().layer(size_limit(max_message, metrics));
    // Tokens guard Collector and Query; health and reflection stay open for probes.
    let push_auth = auth.clone();
    let collector = tonic::service::interceptor::InterceptedService::new(collector, move |r| {
        push_auth.check(crate::auth::Service::Collector, r)
    });
    let query_auth = auth.clone();
    let query = tonic::service::interceptor::InterceptedService::new(query, move |r| {
        query_auth.check(crate::auth::Service::Query, r)
    });
    // The nodes of a cluster call each other with a query (or admin) token.
    let peer = cluster.map(|cluster| {
        let peer_auth = auth.clone();
        let service = PeerServer::new(crate::cluster::PeerService::new(cluster, store))
            .accept_compressed(CompressionEncoding::Zstd)
            .send_compressed(CompressionEncoding::Zstd)
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(usize::MAX);
        tonic::service::interceptor::InterceptedService::new(service, move |r| {
            peer_auth.check(crate::auth::Service::Query, r)
        })
    });
    let router = builder
        .add_service(health_service)
        .add_service(collector)
        .add_service(query)
        .add_optional_service(peer);
    let router = with_reflection(router);
    hourglass_rpc::tls::serve_router(router, listener, tls, shutdown).await
}

/// Reports Collector, Query and the whole server (the empty name, which clients without
/// a service name ask about) as serving.
async fn report_serving(health: &tonic_health::server::HealthReporter) {
    health
        .set_serving::<CollectorServer<CollectorService>>()
        .await;
    health.set_serving::<QueryServer<QueryService>>().await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
}

/// The bound of `max_message` bytes on every message. Messages tonic refuses for size
/// never reach a handler: this layer counts and names them.
fn size_limit(
    max_message: usize,
    metrics: Arc<Metrics>,
) -> hourglass_rpc::size_limit::SizeLimitLayer {
    hourglass_rpc::size_limit::SizeLimitLayer::new(
        max_message,
        "limits.max_message_mib",
        Arc::new(move |method: &str| {
            metrics
                .requests_too_large
                .get_or_create(&crate::metrics::MethodLabel {
                    method: method.to_string(),
                })
                .inc();
        }),
    )
}

/// `router` with gRPC reflection (v1 and v1alpha) of hourglass.v1 and health. Reflection
/// is a convenience for grpcurl and friends; a descriptor set that does not load must not
/// keep the aggregator from serving, so it is then left out with a warning.
fn with_reflection<L: Clone>(
    mut router: tonic::transport::server::Router<L>,
) -> tonic::transport::server::Router<L> {
    let configure = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(hourglass_rpc::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    match configure().build_v1() {
        Ok(service) => router = router.add_service(service),
        Err(e) => tracing::warn!(error = %e, "gRPC reflection v1 is off"),
    }
    match configure().build_v1alpha() {
        Ok(service) => router = router.add_service(service),
        Err(e) => tracing::warn!(error = %e, "gRPC reflection v1alpha is off"),
    }
    router
}

#[cfg(test)]
mod sets_tests;
