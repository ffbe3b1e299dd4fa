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

/// `mine` in the generated type's fields, to compare what the two decoded.
fn as_derived(mine: &SeriesBatch) -> Derived {
    Derived {
        metric: mine.metric.clone(),
        tags: mine.tags.clone(),
        items: mine.items.iter().map(Bytes::copy_from_slice).collect(),
        times_unix_seconds: mine.times_unix_seconds.clone(),
        weights: mine.weights.clone(),
        packed_items: mine.packed_items.clone(),
    }
}

/// What both decoders make of `bytes`: the same fields, or both an error.
fn decode_alike(bytes: &[u8]) -> Option<Derived> {
    let mine = SeriesBatch::decode(bytes);
    let derived = Derived::decode(bytes);
    match (mine, derived) {
        (Ok(mine), Ok(derived)) => {
            assert_eq!(as_derived(&mine), derived, "{bytes:02x?}");
            Some(derived)
        }
        (Err(_), Err(_)) => None,
        (mine, derived) => panic!("{bytes:02x?}: hand-written {mine:?}, generated {derived:?}"),
    }
}

/// A key: field `field`, wire type `wire` (0 varint, 2 length-delimited).
fn key(field: u32, wire: u32, out: &mut Vec<u8>) {
    encoding::encode_varint(u64::from(field << 3 | wire), out);
}

#[test]
fn times_and_weights_sent_unpacked_or_in_several_runs_decode_as_generated() {
    // Another client's encoder may send a repeated scalar unpacked (one key per value, as
    // proto2 does), or packed in several runs, or both: every value is kept, in order.
    let mut bytes = Vec::new();
    key(1, 2, &mut bytes);
    bytes.extend_from_slice(&[1, b'm']);
    for t in [1_700_000_000i64, -1, 0] {
        key(4, 0, &mut bytes);
        encoding::encode_varint(t as u64, &mut bytes);
    }
    encoding::int64::encode_packed(4, &[5, -6], &mut bytes);
    key(3, 2, &mut bytes);
    bytes.extend_from_slice(&[1, b'a']);
    for w in [0u64, u64::MAX, 3] {
        key(5, 0, &mut bytes);
        encoding::encode_varint(w, &mut bytes);
    }
    encoding::uint64::encode_packed(5, &[7], &mut bytes);
    key(4, 0, &mut bytes);
    encoding::encode_varint(9, &mut bytes);
    let derived = decode_alike(&bytes).expect("decodes");
    assert_eq!(derived.times_unix_seconds, [1_700_000_000, -1, 0, 5, -6, 9]);
    assert_eq!(derived.weights, [0, u64::MAX, 3, 7]);
    let mine = SeriesBatch::decode(bytes.as_slice()).unwrap();
    // Re-encoded packed, as the generated code re-encodes it.
    assert_eq!(mine.encode_to_vec(), derived.encode_to_vec());
}

#[test]
fn a_field_given_twice_and_a_message_merged_twice_read_as_generated() {
    // metric and packed_items twice (the last wins), items and tags around the others.
    let mut bytes = Vec::new();
    key(3, 2, &mut bytes);
    bytes.extend_from_slice(&[1, b'x']);
    key(1, 2, &mut bytes);
    bytes.extend_from_slice(&[2, b'm', b'1']);
    key(6, 2, &mut bytes);
    bytes.extend_from_slice(&[2, 1, b'p']);
    encoding::message::encode(2, &tag("k", "v"), &mut bytes);
    key(3, 2, &mut bytes);
    bytes.extend_from_slice(&[0]);
    key(1, 2, &mut bytes);
    bytes.extend_from_slice(&[2, b'm', b'2']);
    key(6, 2, &mut bytes);
    bytes.extend_from_slice(&[2, 1, b'q']);
    key(3, 2, &mut bytes);
    bytes.extend_from_slice(&[1, b'y']);
    let derived = decode_alike(&bytes).expect("decodes");
    assert_eq!(derived.metric, "m2");
    assert_eq!(&derived.packed_items[..], b"\x01q");
    assert_eq!(derived.items, [&b"x"[..], b"", b"y"]);
    // One message merged into another, either way round.
    let (first, _) = both(&[b"a"], b"");
    let (second, _) = both(&[], b"\x01z");
    let mut mine = first.clone();
    mine.merge(second.encode_to_vec().as_slice()).unwrap();
    let mut generated = as_derived(&first);
    generated.merge(second.encode_to_vec().as_slice()).unwrap();
    assert_eq!(as_derived(&mine), generated);
    assert_eq!(mine.encoded_len(), mine.encode_to_vec().len());
    assert_eq!(mine.encode_to_vec(), generated.encode_to_vec());
}

/// `IngestRequest`'s shape: batches in field 2, to decode a batch as a nested message.
#[derive(Clone, PartialEq, prost::Message)]
struct Outer {
    #[prost(message, repeated, tag = "2")]
    batches: Vec<SeriesBatch>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct OuterDerived {
    #[prost(message, repeated, tag = "2")]
    batches: Vec<Derived>,
}

#[test]
fn a_nested_batch_ends_where_its_length_says_as_generated() {
    // An item whose length runs past the end of its batch, into the bytes after it: refused
    // by both (the batch's length is exceeded), never read from the next field.
    let mut inner = Vec::new();
    key(3, 2, &mut inner);
    inner.extend_from_slice(&[4, b'a', b'b']);
    let mut bytes = Vec::new();
    key(2, 2, &mut bytes);
    encoding::encode_varint(inner.len() as u64, &mut bytes);
    bytes.extend_from_slice(&inner);
    key(9, 2, &mut bytes);
    bytes.extend_from_slice(&[0]);
    assert!(OuterDerived::decode(bytes.as_slice()).is_err());
    assert!(Outer::decode(bytes.as_slice()).is_err());
    // Two batches, each whole: the same as generated.
    let (a, _) = both(&[b"a", b""], b"");
    let (b, _) = both(&[], b"\x02bc");
    let outer = Outer {
        batches: vec![a.clone(), b.clone()],
    };
    let encoded = outer.encode_to_vec();
    assert_eq!(encoded.len(), outer.encoded_len());
    let derived = OuterDerived::decode(encoded.as_slice()).unwrap();
    assert_eq!(derived.batches, [as_derived(&a), as_derived(&b)]);
    assert_eq!(derived.encode_to_vec(), encoded);
    assert_eq!(Outer::decode(encoded.as_slice()).unwrap(), outer);
    // Unknown groups nested past the recursion limit: an error, not a stack overflow.
    let mut deep = Vec::new();
    for _ in 0..200 {
        key(9, 3, &mut deep);
    }
    for _ in 0..200 {
        key(9, 4, &mut deep);
    }
    assert!(decode_alike(&deep).is_none());
    let mut nested = Vec::new();
    key(2, 2, &mut nested);
    encoding::encode_varint(deep.len() as u64, &mut nested);
    nested.extend_from_slice(&deep);
    assert!(Outer::decode(nested.as_slice()).is_err());
    assert!(OuterDerived::decode(nested.as_slice()).is_err());
}

#[test]
fn any_bytes_decode_as_the_generated_code_decodes_them() {
    // Mutations of a valid batch (bytes changed, cut, lengths made huge) and random bytes:
    // the hand-written decoder keeps what the generated one keeps, or refuses what it
    // refuses, and never panics.
    let (mine, _) = both(&[b"alice", b"", b"bob"], b"\x01z");
    let valid = mine.encode_to_vec();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut ok = 0;
    for round in 0..20_000 {
        let mut bytes = if round % 4 == 0 {
            (0..next() % 40).map(|_| next() as u8).collect()
        } else {
            valid.clone()
        };
        for _ in 0..=next() % 3 {
            if bytes.is_empty() {
                break;
            }
            let at = (next() as usize) % bytes.len();
            match next() % 4 {
                0 => bytes[at] = next() as u8,
                1 => bytes.truncate(at),
                2 => bytes.insert(at, next() as u8),
                _ => {
                    // A huge varint length.
                    bytes.splice(
                        at..at,
                        [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
                    );
                }
            }
        }
        if let Some(derived) = decode_alike(&bytes) {
            ok += 1;
            let again = SeriesBatch::decode(bytes.as_slice()).unwrap();
            assert_eq!(again.encoded_len(), again.encode_to_vec().len());
            assert_eq!(again.encode_to_vec(), derived.encode_to_vec());
        }
    }
    assert!(ok > 1000, "{ok} decoded");
}
