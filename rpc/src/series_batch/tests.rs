//! The hand-written `SeriesBatch` against the code prost generates for the same fields:
//! the same bytes both ways, and a cut or mistyped field refused with what is wrong.

use super::*;

/// `hourglass.v1.SeriesBatch` as prost derives it from the `.proto` (the code this module
/// replaces).
#[derive(Clone, PartialEq, prost::Message)]
struct Derived {
    #[prost(string, tag = "1")]
    metric: String,
    #[prost(message, repeated, tag = "2")]
    tags: Vec<Tag>,
    #[prost(bytes = "bytes", repeated, tag = "3")]
    items: Vec<Bytes>,
    #[prost(int64, repeated, tag = "4")]
    times_unix_seconds: Vec<i64>,
    #[prost(uint64, repeated, tag = "5")]
    weights: Vec<u64>,
    #[prost(bytes = "bytes", tag = "6")]
    packed_items: Bytes,
}

fn tag(key: &str, value: &str) -> Tag {
    Tag {
        key: key.into(),
        value: value.into(),
    }
}

/// The same batch in both types.
fn both(items: &[&[u8]], packed: &[u8]) -> (SeriesBatch, Derived) {
    let mine = SeriesBatch {
        metric: "visits".into(),
        tags: vec![tag("page", "/a"), tag("region", "eu")],
        items: items.iter().collect(),
        times_unix_seconds: vec![1_700_000_000, -1, 0],
        weights: vec![1, u64::MAX],
        packed_items: Bytes::copy_from_slice(packed),
    };
    let derived = Derived {
        metric: mine.metric.clone(),
        tags: mine.tags.clone(),
        items: items.iter().map(|i| Bytes::copy_from_slice(i)).collect(),
        times_unix_seconds: mine.times_unix_seconds.clone(),
        weights: mine.weights.clone(),
        packed_items: mine.packed_items.clone(),
    };
    (mine, derived)
}

#[test]
fn a_batch_encodes_and_decodes_as_the_generated_code_does() {
    let long = vec![7u8; 300];
    let cases: [(&[&[u8]], &[u8]); 4] = [
        (&[b"alice", b"", b"bob", &long], b""),
        (&[], b"\x01x"),
        (&[b""], b""),
        (&[], b""),
    ];
    for (items, packed) in cases {
        let (mine, derived) = both(items, packed);
        let bytes = mine.encode_to_vec();
        assert_eq!(bytes, derived.encode_to_vec(), "{items:?}");
        assert_eq!(mine.encoded_len(), bytes.len());
        assert_eq!(SeriesBatch::decode(&bytes[..]).unwrap(), mine);
        assert_eq!(Derived::decode(&bytes[..]).unwrap(), derived);
    }
    // Defaults encode to nothing, as every proto3 message's do.
    assert!(SeriesBatch::default().encode_to_vec().is_empty());
}

#[test]
fn items_read_back_in_order_with_empty_ones_kept() {
    let (mine, _) = both(&[b"a", b"", b"ccc"], b"");
    let decoded = SeriesBatch::decode(mine.encode_to_vec().as_slice()).unwrap();
    let items: Vec<&[u8]> = decoded.items.iter().collect();
    assert_eq!(items, [&b"a"[..], b"", b"ccc"]);
    assert_eq!(decoded.items.len(), 3);
    assert_eq!(decoded.items.iter().len(), 3);
    assert_eq!(decoded.items.get(2), Some(&b"ccc"[..]));
    assert_eq!(decoded.items.get(1), Some(&b""[..]));
    assert_eq!(decoded.items.get(3), None);
    assert!(!decoded.items.is_empty() && Items::new().is_empty());
    // Merging a second message appends its items, as a repeated field does.
    let mut merged = decoded.clone();
    merged
        .merge(both(&[b"d"], b"").0.encode_to_vec().as_slice())
        .unwrap();
    let items: Vec<&[u8]> = merged.items.iter().collect();
    assert_eq!(items, [&b"a"[..], b"", b"ccc", b"d"]);
    let mut cleared = merged;
    cleared.clear();
    assert_eq!(cleared, SeriesBatch::default());
}

#[test]
fn a_cut_or_mistyped_item_is_refused_with_the_field_named() {
    let (mine, _) = both(&[b"alice", b"bob"], b"");
    let bytes = mine.encode_to_vec();
    // Cut inside the last item: every prefix that ends inside a field is an error, and
    // none panics.
    for cut in 0..bytes.len() {
        let _ = SeriesBatch::decode(&bytes[..cut]);
    }
    let item_at = bytes.windows(3).position(|w| w == b"bob").unwrap();
    let e = SeriesBatch::decode(&bytes[..item_at + 2]).unwrap_err();
    assert!(e.to_string().contains("SeriesBatch.items"), "{e}");
    assert!(e.to_string().contains("buffer underflow"), "{e}");
    // Field 3 as a varint instead of length-delimited.
    let e = SeriesBatch::decode(&[0x18, 0x01][..]).unwrap_err();
    assert!(e.to_string().contains("SeriesBatch.items"), "{e}");
    assert!(e.to_string().contains("wire type"), "{e}");
    // A length past the end of the message.
    let e = SeriesBatch::decode(&[0x1a, 0x05, b'a'][..]).unwrap_err();
    assert!(e.to_string().contains("buffer underflow"), "{e}");
}

#[test]
fn fields_this_build_does_not_know_are_skipped() {
    let (mine, _) = both(&[b"x"], b"");
    let mut bytes = mine.encode_to_vec();
    // Field 9, length-delimited, 2 bytes; then field 10, a varint.
    bytes.extend_from_slice(&[0x4a, 0x02, b'h', b'i', 0x50, 0x2a]);
    assert_eq!(SeriesBatch::decode(bytes.as_slice()).unwrap(), mine);
}
