//! Writes the seed inputs of every fuzz target into `fuzz/seeds/TARGET/`, built with the
//! library's own encoders so that they are valid inputs the fuzzer mutates from.
//!
//! ```sh
//! cd fuzz && CARGO_TARGET_DIR=… cargo run --example make_seeds
//! ```
//!
//! The seeds are committed; run this again only when an encoding or a target's input
//! layout changes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hourglass_sketch::format::{CHECKSUM_LEN, HEADER_LEN, Kind};
use hourglass_rpc::proto::v1;
use hourglass_sketch::Sketch;
use hourglass_sketch::bloom::Bloom;
use hourglass_sketch::frequency::{Frequency, FrequencyParams};
use hourglass_sketch::hll::Hll;
use hourglass_sketch::ull::Ull;
use hourglass_agent::ingest::StatsdHandler;
use hourglass_agent::metrics::Metrics;
use hourglass_agent::table::Table;
use prost::Message;

fn main() -> std::io::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let sketches = sketches();

    for (name, sketch) in &sketches {
        let encoded = sketch.encode();
        let unsummed = &encoded[..encoded.len() - CHECKSUM_LEN];
        write(
            &root,
            "sketch_decode",
            &format!("{name}-whole"),
            &[&[0], &encoded],
        )?;
        write(
            &root,
            "sketch_decode",
            &format!("{name}-unsummed"),
            &[&[1], unsummed],
        )?;
        let target = match sketch.kind() {
            Kind::Distinct => "hll_decode",
            Kind::Frequency => "frequency_decode",
            Kind::Membership => "bloom_decode",
        };
        write(&root, target, name, &[body(&encoded)])?;
    }

    // Pairs of the same parameters, so the seeds merge.
    for (i, (name_a, a)) in sketches.iter().enumerate() {
        for (name_b, b) in &sketches[i..] {
            let mut merged = a.clone();
            if merged.merge(b).is_err() {
                continue;
            }
            let (ea, eb) = (a.encode(), b.encode());
            let (body_a, body_b) = (body(&ea), body(&eb));
            let selector = [Kind::ALL.iter().position(|&k| k == a.kind()).unwrap() as u8];
            let len = (body_a.len() as u16).to_le_bytes();
            write(
                &root,
                "sketch_merge",
                &format!("{name_a}+{name_b}"),
                &[&selector, &len, body_a, body_b],
            )?;
        }
    }

    let snapshots = sketches
        .iter()
        .enumerate()
        .map(|(i, (name, sketch))| v1::Snapshot {
            series: Some(v1::Series {
                metric: format!("seed.{name}"),
                tags: vec![v1::Tag {
                    key: "region".into(),
                    value: "eu".into(),
                }],
            }),
            hour: 490_000 + i as u32,
            epoch: 7,
            version: 1 + i as u64,
            sketch: Some(v1::EncodedSketch {
                kind: i32::from(sketch.kind().code()),
                data: sketch.encode().into(),
            }),
        })
        .collect::<Vec<_>>();
    for (i, snapshot) in snapshots.iter().enumerate() {
        let request = v1::PushRequest {
            server: Some(v1::Server {
                name: "web-1".into(),
                labels: vec![v1::Tag {
                    key: "role".into(),
                    value: "web".into(),
                }],
            }),
            snapshots: vec![snapshot.clone()],
            live_hours: vec![490_000],
        };
        write(
            &root,
            "push_validate",
            &format!("one-{i}"),
            &[&request.encode_to_vec()],
        )?;
    }
    let request = v1::PushRequest {
        server: Some(v1::Server {
            name: "web-2".into(),
            labels: vec![],
        }),
        snapshots,
        live_hours: vec![490_000, 490_001],
    };
    write(&root, "push_validate", "all", &[&request.encode_to_vec()])?;

    let datagrams: [&[u8]; 6] = [
        b"visitors:user42|s|#country:de,device:mobile|T1700000000",
        b"visitors:user42|s\npages:/cart|s|#method:GET\r\nlatency:12|ms|@0.5|#a:b",
        b"requests:1|c|#env:prod|c:abc123",
        b"_sc|disk|0|#host:a",
        b"_e{5,4}:title|text",
        b"users:u1|s|@0.1|#tag|e:it-false",
    ];
    for (i, datagram) in datagrams.iter().enumerate() {
        write(&root, "statsd_parse", &format!("lines-{i}"), &[datagram])?;
        write(&root, "statsd_handler", &format!("lines-{i}"), &[datagram])?;
    }
    write(
        &root,
        "statsd_handler",
        "several",
        &[datagrams[0], b"\xff", datagrams[1]],
    )?;

    let checkpoint = checkpoint(&datagrams)?;
    let unsummed = &checkpoint[..checkpoint.len() - 8];
    write(&root, "checkpoint_decode", "whole", &[&[0], &checkpoint])?;
    write(&root, "checkpoint_decode", "unsummed", &[&[1], unsummed])?;
    Ok(())
}

/// Small sketches of each kind and representation, named for their files.
fn sketches() -> Vec<(String, Sketch)> {
    let items = |n: u32| (0..n).map(|i| format!("item-{i}").into_bytes());
    let mut out = Vec::new();
    for (precision, n) in [(4, 0), (4, 3), (4, 200), (6, 1), (10, 40), (10, 3000)] {
        let mut s = Hll::new(precision).unwrap();
        items(n).for_each(|i| s.insert(&i));
        let repr = if s.is_sparse() { "sparse" } else { "dense" };
        out.push((
            format!("hll-p{precision}-{repr}-{n}"),
            Sketch::Distinct(s.into()),
        ));
    }
    for (precision, n) in [(4, 0), (4, 3), (4, 200), (6, 1), (10, 40), (10, 3000)] {
        let mut s = Ull::new(precision).unwrap();
        items(n).for_each(|i| s.insert(&i));
        let repr = if s.is_sparse() { "sparse" } else { "dense" };
        out.push((
            format!("ull-p{precision}-{repr}-{n}"),
            Sketch::Distinct(s.into()),
        ));
    }
    for (conservative, n) in [(false, 0), (false, 25), (true, 25)] {
        let params = FrequencyParams {
            width: 8,
            depth: 2,
            conservative,
            capacity: 4,
        };
        let mut s = Frequency::new(params).unwrap();
        for (i, item) in items(n).enumerate() {
            s.insert_weighted(&item, 1 + (i as u64 % 3)).unwrap();
        }
        let update = if conservative {
            "conservative"
        } else {
            "standard"
        };
        out.push((format!("frequency-{update}-{n}"), Sketch::Frequency(s)));
    }
    for (capacity, n) in [(10, 0), (10, 5), (10, 40), (100, 30)] {
        let mut s = Bloom::new(capacity, 0.1).unwrap();
        items(n).for_each(|i| s.insert(&i));
        out.push((format!("bloom-{capacity}-{n}"), Sketch::Membership(s)));
    }
    out
}

/// The body of a frame.
fn body(encoded: &[u8]) -> &[u8] {
    &encoded[HEADER_LEN..encoded.len() - CHECKSUM_LEN]
}

/// A checkpoint of a table fed `datagrams`, as the agent writes it.
fn checkpoint(datagrams: &[&[u8]]) -> std::io::Result<Vec<u8>> {
    let config = hourglass_fuzz::small_config();
    let table = Arc::new(Mutex::new(Table::new(Arc::new(config), 3)));
    let mut handler = StatsdHandler::new(Arc::clone(&table), Arc::new(Metrics::new()));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let stamped = format!("visitors:user7|s|#country:fr|T{now}\nvisitors:user8|s");
    handler.handle(datagrams.iter().copied().chain([stamped.as_bytes()]));
    let dir = std::env::temp_dir().join(format!("hourglass-fuzz-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    hourglass_agent::checkpoint::write(&table, &dir, "web-1").map_err(std::io::Error::other)?;
    let bytes = std::fs::read(hourglass_agent::checkpoint::path(&dir))?;
    std::fs::remove_dir_all(&dir)?;
    Ok(bytes)
}

fn write(root: &Path, target: &str, name: &str, parts: &[&[u8]]) -> std::io::Result<()> {
    let dir = root.join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), parts.concat())
}
