//! Tests of `Ull::insert_all` (and `SparseTokens::reserve` / `trim`): the sketch a
//! run makes must equal, byte for byte, the one of inserting the same items one by one,
//! from every state, and hold at most twice the memory.

use super::*;
use sparse::SparseTokens;

fn items(state: &mut u64, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| splitmix(state).to_le_bytes().to_vec())
        .collect()
}

/// Checks `all` (built with insert_all) against `one` (one by one): equal, same body,
/// same estimate, same sparse/dense state.
fn check_same(all: &Ull, one: &Ull, what: &str) {
    assert_eq!(all.is_sparse(), one.is_sparse(), "{what}: state");
    assert_eq!(all, one, "{what}: equality");
    assert_eq!(body_of(all), body_of(one), "{what}: body");
    assert_eq!(
        all.estimate().estimate.to_bits(),
        one.estimate().estimate.to_bits(),
        "{what}: estimate"
    );
}

/// Every precision, runs that end just below, at, and just above the sparse limit, from
/// an empty sketch, from a decoded (sorted list) sketch, and from a table; repeated items
/// inside a run and across runs.
#[test]
fn insert_all_equals_one_by_one_every_precision_and_boundary() {
    let mut state = 0x5eed;
    for precision in MIN_PRECISION..=MAX_PRECISION {
        let limit = sparse_limit(precision);
        // Run lengths around the limit (from empty), and small ones.
        let mut lens = vec![0usize, 1, 2, 3, limit - 1, limit, limit + 1, limit + 2];
        if precision <= 12 {
            lens.push(2 * limit + 3);
        }
        for &len in &lens {
            let fresh = items(&mut state, len);
            // From empty.
            let mut one = Ull::new(precision).unwrap();
            fresh.iter().for_each(|i| one.insert(i));
            let mut all = Ull::new(precision).unwrap();
            all.insert_all(fresh.iter().map(Vec::as_slice));
            check_same(&all, &one, &format!("p={precision} len={len} from empty"));

            // From a decoded sketch holding half the limit, a run of `len` (with repeats of
            // what it holds and of itself).
            let base_items = items(&mut state, limit / 2);
            let base = {
                let mut s = Ull::new(precision).unwrap();
                base_items.iter().for_each(|i| s.insert(i));
                Ull::decode_body(&body_of(&s)).unwrap()
            };
            let run: Vec<Vec<u8>> = fresh
                .iter()
                .cloned()
                .chain(base_items.iter().take(3).cloned())
                .chain(fresh.iter().take(5).cloned())
                .collect();
            let mut one = base.clone();
            run.iter().for_each(|i| one.insert(i));
            let mut all = base.clone();
            all.insert_all(run.iter().map(Vec::as_slice));
            check_same(&all, &one, &format!("p={precision} len={len} from decoded"));

            // From a table (one item inserted the ordinary way first).
            let mut one = base.clone();
            one.insert(b"first");
            let mut all = one.clone();
            run.iter().for_each(|i| one.insert(i));
            all.insert_all(run.iter().map(Vec::as_slice));
            check_same(&all, &one, &format!("p={precision} len={len} from a table"));
        }
    }
}

/// Runs that each cross nothing but accumulate past the limit, alternating with decodes
/// and with one-by-one inserts on the insert_all side; same sketch at every step.
#[test]
fn insert_all_in_many_runs_with_decodes_crossing_the_limit() {
    let mut state = 77;
    for precision in [4u8, 5, 8, 11, 14, 16] {
        let limit = sparse_limit(precision);
        for run in [1usize, 2, 3, limit / 4 + 1, limit / 2, limit - 1] {
            let run = run.max(1);
            // Keep it fast: runs of a few items only at the small precisions (each run
            // may decode the whole sketch).
            if precision > 11 && run < limit / 8 {
                continue;
            }
            let all_items = items(&mut state, 2 * limit + 7);
            let mut one = Ull::new(precision).unwrap();
            let mut all = Ull::new(precision).unwrap();
            for (k, chunk) in all_items.chunks(run).enumerate() {
                chunk.iter().for_each(|i| one.insert(i));
                match k % 3 {
                    0 => all.insert_all(chunk.iter().map(Vec::as_slice)),
                    1 => {
                        all = Ull::decode_body(&body_of(&all)).unwrap();
                        all.insert_all(chunk.iter().map(Vec::as_slice));
                    }
                    _ => {
                        // A run of repeats of the chunk (twice), and the empty run.
                        let twice: Vec<&[u8]> = chunk
                            .iter()
                            .chain(chunk.iter())
                            .map(Vec::as_slice)
                            .collect();
                        all.insert_all(twice.into_iter());
                        all.insert_all(std::iter::empty());
                    }
                }
                check_same(&all, &one, &format!("p={precision} run={run} chunk {k}"));
                if !one.is_sparse() && k > 3 {
                    break;
                }
            }
        }
    }
}

/// Tokens that share indices (many ranks per index, clustered indices at the top of the
/// range so probes wrap), fed to a table after `reserve` (and `trim`), equal the
/// one-by-one table, and every insert reports the same change.
#[test]
fn reserve_then_insert_equals_one_by_one_for_shared_indices() {
    let mut state = 3;
    let shapes: Vec<Vec<u32>> = vec![
        // Few indices, every rank, in a scrambled order.
        (0..2000)
            .map(|_| {
                let r = splitmix(&mut state);
                ((r as u32 % 17) << 6) | (1 + (r >> 32) as u32 % 40)
            })
            .collect(),
        // Clustered at the top of the index range: home slots at the table's end.
        (0..3000)
            .map(|_| {
                let r = splitmix(&mut state);
                (((1u32 << 25) - 1 - (r as u32 % 700)) << 6) | (1 + (r >> 32) as u32 % 40)
            })
            .collect(),
        // Clustered at index 0 and the top together.
        (0..3000)
            .map(|_| {
                let r = splitmix(&mut state);
                let idx = if r & 1 == 0 {
                    r as u32 >> 1 & 511
                } else {
                    (1u32 << 25) - 1 - (r as u32 >> 1 & 511)
                };
                idx << 6 | (1 + (r >> 32) as u32 % 40)
            })
            .collect(),
        // Uniform.
        (0..3000)
            .map(|_| sparse::token_of_hash(splitmix(&mut state)))
            .collect(),
    ];
    for (s, tokens) in shapes.iter().enumerate() {
        for &most in &[16usize, 256, 1024, 4096, 65536] {
            for split in [0usize, 1, 10, 500] {
                let split = split.min(tokens.len());
                // One by one.
                let mut one = SparseTokens::default();
                let mut one_changed = Vec::new();
                for &t in tokens.iter() {
                    one_changed.push(one.insert(t));
                    if one.indices() > most {
                        break;
                    }
                }
                // Some tokens, a decode (sorted list), then reserve the rest and insert.
                let mut all = SparseTokens::default();
                let mut all_changed = Vec::new();
                for &t in &tokens[..split] {
                    all_changed.push(all.insert(t));
                    if all.indices() > most {
                        break;
                    }
                }
                if all.indices() <= most {
                    all = SparseTokens::from_canonical(all.canonical().into_owned());
                    all.reserve(tokens.len() - split, most);
                    for &t in &tokens[split..] {
                        all_changed.push(all.insert(t));
                        if all.indices() > most {
                            break;
                        }
                    }
                    all.trim();
                }
                assert_eq!(
                    all_changed, one_changed,
                    "shape {s} most {most} split {split}"
                );
                assert_eq!(all.indices(), one.indices());
                assert_eq!(
                    &*all.canonical(),
                    &*one.canonical(),
                    "shape {s} most {most} split {split}"
                );
            }
        }
    }
}

/// The memory claim: `size_bytes` after insert_all is never more than twice what the
/// same items inserted one by one hold, in every state — including the run that adds no
/// item at all to a decoded sketch (one by one, nothing happens: the sorted list stays).
#[test]
fn empty_run_after_decode_holds_at_most_twice_the_memory() {
    let mut state = 9;
    for precision in [10u8, 14, 18] {
        let limit = sparse_limit(precision);
        let base_items = items(&mut state, limit * 3 / 4);
        let mut s = Ull::new(precision).unwrap();
        s.insert_all(base_items.iter().map(Vec::as_slice));
        let decoded = Ull::decode_body(&body_of(&s)).unwrap();
        let one = decoded.clone(); // one by one: no items, nothing done
        let mut all = decoded.clone();
        all.insert_all(std::iter::empty());
        assert_eq!(all, one);
        assert!(
            all.size_bytes() <= 2 * one.size_bytes(),
            "p={precision}: an empty insert_all on a decoded sketch of {} indices holds {} bytes, \
             one by one (nothing) holds {}",
            limit * 3 / 4,
            all.size_bytes(),
            one.size_bytes()
        );
    }
}

/// The memory claim, for non-empty runs: never more than twice one by one, at every
/// precision, from empty, from decoded and from a table, including runs of repeats.
#[test]
fn nonempty_runs_hold_at_most_twice_the_memory() {
    let mut state = 21;
    for precision in MIN_PRECISION..=16 {
        let limit = sparse_limit(precision);
        for len in [1usize, 2, 5, limit / 3 + 1, limit - 1, limit] {
            let base_items = items(&mut state, limit / 2);
            let fresh = items(&mut state, len);
            for from in ["empty", "decoded", "table", "repeats"] {
                let start = match from {
                    "empty" => Ull::new(precision).unwrap(),
                    _ => {
                        let mut s = Ull::new(precision).unwrap();
                        base_items.iter().for_each(|i| s.insert(i));
                        let mut d = Ull::decode_body(&body_of(&s)).unwrap();
                        if from == "table" {
                            d.insert(b"x");
                        }
                        d
                    }
                };
                let run: Vec<&[u8]> = if from == "repeats" {
                    (0..len * 4)
                        .map(|k| base_items[k % base_items.len().max(1)].as_slice())
                        .collect()
                } else {
                    fresh.iter().map(Vec::as_slice).collect()
                };
                let mut one = start.clone();
                run.iter().for_each(|i| one.insert(i));
                let mut all = start.clone();
                all.insert_all(run.iter().copied());
                assert_eq!(all, one, "p={precision} len={len} from {from}");
                assert!(
                    all.size_bytes() <= 2 * one.size_bytes(),
                    "p={precision} len={len} from {from}: {} bytes, one by one {}",
                    all.size_bytes(),
                    one.size_bytes()
                );
            }
        }
    }
}
