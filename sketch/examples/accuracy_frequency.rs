//! Accuracy of the `frequency` sketch kind against its guarantees, on Zipf streams.
//!
//! ```text
//! cargo run --release --example accuracy_frequency
//! ```
//!
//! Two targets, each checked per setting and printed as a markdown table with a verdict:
//!
//! 1. **Count-Min**: the fraction of distinct items whose estimate exceeds the truth by
//!    more than `ε·N` is at most `δ` (standard and conservative update). Estimates are
//!    never below the truth.
//! 2. **Frequent items**: every item with frequency above `ε·N` is reported, and
//!    `lower ≤ truth ≤ upper` holds for every item of the universe, for one sketch of the
//!    whole stream and for 16 shards encoded, decoded and merged in a random tree.
//!
//! Streams are seeded, so every run prints the same figures.

use hourglass_sketch::countmin::CountMin;
use hourglass_sketch::frequency::{Frequency, FrequencyParams};
use hourglass_sketch::hash::item_hash;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// Distinct items a stream draws from.
const UNIVERSE: usize = 1_000_000;
/// Events per stream.
const EVENTS: usize = 10_000_000;
/// Zipf exponents.
const EXPONENTS: [f64; 3] = [0.8, 1.0, 1.2];
/// Count-Min settings `(ε, δ)`.
const CMS_SETTINGS: [(f64, f64); 3] = [(0.01, 0.05), (0.001, 0.01), (0.0001, 0.001)];
/// Frequent-items settings `ε` (capacity `⌈1/ε⌉`).
const FI_EPSILONS: [f64; 2] = [0.01, 0.001];
/// Shards merged in the distributed runs.
const SHARDS: usize = 16;

/// A Zipf sampler over ranks `0..n`: `P(r) ∝ 1/(r+1)^s`, by inverse CDF over the
/// precomputed cumulative weights.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut total = 0.0;
        let cumulative = (0..n)
            .map(|r| {
                total += 1.0 / ((r + 1) as f64).powf(s);
                total
            })
            .collect();
        Zipf { cumulative }
    }

    fn sample(&self, rng: &mut StdRng) -> u32 {
        let total = *self.cumulative.last().unwrap_or(&0.0);
        let u = rng.random::<f64>() * total;
        let rank = self.cumulative.partition_point(|&c| c <= u);
        rank.min(self.cumulative.len() - 1) as u32
    }
}

/// The bytes of the item of rank `r`.
fn item(rank: u32) -> [u8; 8] {
    u64::from(rank).to_le_bytes()
}

struct Stream {
    exponent: f64,
    events: Vec<u32>,
    truth: Vec<u64>,
}

impl Stream {
    fn generate(exponent: f64, seed: u64) -> Stream {
        let zipf = Zipf::new(UNIVERSE, exponent);
        let mut rng = StdRng::seed_from_u64(seed);
        let events: Vec<u32> = (0..EVENTS).map(|_| zipf.sample(&mut rng)).collect();
        let mut truth = vec![0u64; UNIVERSE];
        for &r in &events {
            truth[r as usize] += 1;
        }
        Stream {
            exponent,
            events,
            truth,
        }
    }

    fn distinct(&self) -> usize {
        self.truth.iter().filter(|&&f| f > 0).count()
    }
}

fn verdict(pass: bool) -> &'static str {
    if pass { "PASS" } else { "FAIL" }
}

/// Target 1: per setting, the fraction of distinct items over-counted by more than εN.
fn count_min_table(streams: &[Stream], hashes: &[u64]) -> bool {
    println!("## Count-Min: fraction of distinct items with estimate − truth > ε·N\n");
    println!(
        "| s | ε | δ | update | width × depth | distinct | ⌈ε·N⌉ | max over | mean over | under | fraction > ε·N | target ≤ δ |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut all = true;
    for stream in streams {
        for &(epsilon, delta) in &CMS_SETTINGS {
            for conservative in [false, true] {
                let standard = CountMin::with_error(epsilon, delta).expect("valid settings");
                let mut sketch = CountMin::new(standard.width(), standard.depth(), conservative)
                    .expect("valid dimensions");
                for &r in &stream.events {
                    sketch.insert_hash_weighted(hashes[r as usize], 1);
                }
                let limit = sketch.max_overcount();
                let (mut distinct, mut over_limit, mut under, mut max_over, mut sum_over) =
                    (0u64, 0u64, 0u64, 0u64, 0u128);
                for (r, &f) in stream.truth.iter().enumerate() {
                    if f == 0 {
                        continue;
                    }
                    distinct += 1;
                    let estimate = sketch.estimate_hash(hashes[r]);
                    if estimate < f {
                        under += 1;
                        continue;
                    }
                    let over = estimate - f;
                    max_over = max_over.max(over);
                    sum_over += u128::from(over);
                    if over > limit {
                        over_limit += 1;
                    }
                }
                let fraction = over_limit as f64 / distinct as f64;
                let pass = under == 0 && fraction <= delta;
                all &= pass;
                println!(
                    "| {} | {epsilon} | {delta} | {} | {} × {} | {distinct} | {limit} | {max_over} | {:.1} | {under} | {fraction:.5} | {} |",
                    stream.exponent,
                    if conservative {
                        "conservative"
                    } else {
                        "standard"
                    },
                    sketch.width(),
                    sketch.depth(),
                    sum_over as f64 / distinct as f64,
                    verdict(pass),
                );
            }
        }
    }
    println!();
    all
}

/// Frequency sketches of one stream: one of the whole stream, or `SHARDS` shards
/// (events assigned at random) encoded, decoded and merged in a random tree.
fn build(stream: &Stream, params: FrequencyParams, sharded: bool, seed: u64) -> Frequency {
    let mut rng = StdRng::seed_from_u64(seed);
    if !sharded {
        let mut sketch = Frequency::new(params).expect("valid params");
        for &r in &stream.events {
            sketch.insert(&item(r)).expect("short item");
        }
        return sketch;
    }
    let mut shards: Vec<Frequency> = (0..SHARDS)
        .map(|_| Frequency::new(params).expect("valid params"))
        .collect();
    for &r in &stream.events {
        shards[rng.random_range(0..SHARDS)]
            .insert(&item(r))
            .expect("short item");
    }
    let mut pool: Vec<Frequency> = shards
        .iter()
        .map(|s| Frequency::decode(&s.encode()).expect("own encoding decodes"))
        .collect();
    while pool.len() > 1 {
        let mut left = pool.swap_remove(rng.random_range(0..pool.len()));
        let right = pool.swap_remove(rng.random_range(0..pool.len()));
        left.merge(&right).expect("same params");
        pool.push(left);
    }
    pool.pop().expect("one sketch remains")
}

/// Target 2: heavy items reported, bounds contain the truth.
fn frequent_items_table(streams: &[Stream]) -> bool {
    println!("## Frequent items: heavy items reported, lower ≤ truth ≤ upper\n");
    println!(
        "| s | ε | k | layout | items f > ε·N | reported | bound violations | error | N/(k+1) | top-10 recall | estimate − truth > ε·N | verdict |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut all = true;
    for (i, stream) in streams.iter().enumerate() {
        let n = EVENTS as u64;
        let mut by_truth: Vec<u32> = (0..UNIVERSE as u32).collect();
        by_truth.sort_by_key(|&r| std::cmp::Reverse(stream.truth[r as usize]));
        for &epsilon in &FI_EPSILONS {
            let params = FrequencyParams::from_error(epsilon, 0.01).expect("valid settings");
            let k = params.capacity;
            let heavy_limit = epsilon * n as f64;
            for sharded in [false, true] {
                let sketch = build(stream, params, sharded, 1000 + i as u64);
                let fi = sketch.frequent_items();
                let top = sketch.top_k(usize::MAX);
                let reported: std::collections::HashSet<&[u8]> =
                    top.iter().map(|t| &t.item[..]).collect();
                let (mut heavy, mut heavy_reported, mut violations, mut over_eps) =
                    (0u64, 0u64, 0u64, 0u64);
                for (r, &f) in stream.truth.iter().enumerate() {
                    let bytes = item(r as u32);
                    let (lower, upper) = (fi.lower(&bytes), fi.upper(&bytes));
                    let estimate = sketch.estimate(&bytes).estimate;
                    if lower > f || f > upper || estimate < f {
                        violations += 1;
                    }
                    if f > 0 && estimate.saturating_sub(f) as f64 > heavy_limit {
                        over_eps += 1;
                    }
                    if f as f64 > heavy_limit {
                        heavy += 1;
                        if reported.contains(&bytes[..]) {
                            heavy_reported += 1;
                        }
                    }
                }
                let top10: std::collections::HashSet<Vec<u8>> =
                    sketch.top_k(10).into_iter().map(|t| t.item).collect();
                let recall = by_truth[..10]
                    .iter()
                    .filter(|&&r| top10.contains(item(r).as_slice()))
                    .count();
                let error_bound = n / (u64::from(k) + 1);
                let pass = heavy == heavy_reported && violations == 0 && fi.error() <= error_bound;
                all &= pass;
                println!(
                    "| {} | {epsilon} | {k} | {} | {heavy} | {heavy_reported} | {violations} | {} | {error_bound} | {recall}/10 | {over_eps} | {} |",
                    stream.exponent,
                    if sharded {
                        "16 shards, random merge tree"
                    } else {
                        "single sketch"
                    },
                    fi.error(),
                    verdict(pass),
                );
            }
        }
    }
    println!();
    all
}

fn main() {
    let started = Instant::now();
    println!(
        "# frequency accuracy: Zipf streams, universe {UNIVERSE} items, N = {EVENTS} events\n"
    );
    let streams: Vec<Stream> = EXPONENTS
        .iter()
        .enumerate()
        .map(|(i, &s)| Stream::generate(s, 42 + i as u64))
        .collect();
    for stream in &streams {
        println!(
            "- s = {}: {} distinct items, heaviest {} ({:.2}% of N)",
            stream.exponent,
            stream.distinct(),
            stream.truth.iter().max().unwrap_or(&0),
            100.0 * *stream.truth.iter().max().unwrap_or(&0) as f64 / EVENTS as f64
        );
    }
    println!();
    let hashes: Vec<u64> = (0..UNIVERSE as u32).map(|r| item_hash(&item(r))).collect();
    let cms = count_min_table(&streams, &hashes);
    let fi = frequent_items_table(&streams);
    println!("Count-Min target: {}", verdict(cms));
    println!("Frequent-items target: {}", verdict(fi));
    println!("Runtime: {:.1} s", started.elapsed().as_secs_f64());
    if !(cms && fi) {
        std::process::exit(1);
    }
}
