//! Generates the gRPC code of proto/hourglass/v1 (at the repository's top, beside this
//! crate) into OUT_DIR with the vendored protoc, so a fresh machine needs no system
//! protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let protos = [
        "../proto/hourglass/v1/sketch.proto",
        "../proto/hourglass/v1/collector.proto",
        "../proto/hourglass/v1/query.proto",
        "../proto/hourglass/v1/ingest.proto",
        "../proto/hourglass/v1/cluster.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    // The descriptor set lets the aggregator serve gRPC reflection (grpcurl without .proto).
    let descriptors =
        std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("hourglass_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptors)
        // Messages decoded from the received bytes as one `Bytes` (src/codec.rs).
        .codec_path("crate::codec::BytesCodec")
        // Ingested items as `Bytes`: slices of the received message instead of one
        // allocation and copy each, which dominated the agent's ingest profile.
        .bytes(".hourglass.v1.Event.item")
        // A batch's items in one buffer, written by hand (src/series_batch.rs): one
        // `Bytes` each cost a fifth of an agent's CPU on large batches.
        .extern_path(
            ".hourglass.v1.SeriesBatch",
            "crate::series_batch::SeriesBatch",
        )
        .extern_path(".hourglass.v1.Tag", "crate::series_batch::Tag")
        // Pushed sketches as `Bytes` too: a slice of the received message, with no copy
        // between the decoder and the store (a push is mostly sketch bytes).
        .bytes(".hourglass.v1.EncodedSketch.data")
        // Copied rows go to the store as `Bytes` as pushed ones do.
        .bytes(".hourglass.v1.CopiedRow.sketch")
        .compile_with_config(config, &protos, &["../proto"])?;
    Ok(())
}
