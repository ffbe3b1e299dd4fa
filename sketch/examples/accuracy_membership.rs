//! Membership over a range ([`hourglass_sketch::membership`]) on the demo's week:
//! `hourglass demo`'s traffic model, one Bloom filter per server-hour, 6 servers × 168
//! hours = 1,008 filters, "was this user seen this week?".
//!
//! `cargo run --release -p hourglass-sketch --example accuracy_membership -- [--lookups L]
//!  [--seed S]`
//!
//! The model is the demo's (`hourglass simulate`): 2,000 visits per server-hour, each by
//! a user drawn Zipf(s = 1), 70% of the time from the server's region's third of 200,000
//! users and 30% from all of them. Filters are sized with
//! [`RangeSizing::for_range`] for the whole week at a wanted range false-positive rate of
//! 5% and of 1%, with the expected distinct users per filter taken from a pilot day of
//! another seed (what a metric's owner would declare), rounded up to a hundred. Targets,
//! for each setting:
//!
//! 1. of `L` lookups of users never seen (`nobody0`, `nobody1`, …), the share answered
//!    "definitely absent" is at least 1 − the wanted rate (≥ 95% at 5%);
//! 2. every user seen in the week is found, in every server-hour that saw them (0 misses);
//! 3. the stated false-positive probability (`range_fpr` of the answer) is within 20% of
//!    the share of absent lookups answered "seen".
//!
//! For comparison it prints the demo's filters today (capacity 20,000 at 1% per
//! server-hour) looked up the same way, and merged into one filter as the aggregator
//! answers today, and the default sizing (capacity 100,000 at 1%) merged. Seeded: the
//! same command prints the same figures.

use hourglass_sketch::bloom::Bloom;
use hourglass_sketch::hash::item_hash;
use hourglass_sketch::membership::{RangeAnswer, RangeSizing, all_maybe_probability, lookup_hash};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

const SERVERS: usize = 6;
const HOURS: usize = 168;
const FILTERS: usize = SERVERS * HOURS;
const VISITS_PER_HOUR: usize = 2_000;
const USERS: u32 = 200_000;
const REGIONS: u32 = 3;
/// Wanted false-positive rates of a week's lookup.
const WANTED: [f64; 2] = [0.05, 0.01];
/// Lookups of absent users for the comparison rows (large filters: kept small).
const COMPARISON_LOOKUPS: u64 = 10_000;

struct Options {
    lookups: u64,
    seed: u64,
}

fn parse_options() -> Options {
    let mut o = Options {
        lookups: 100_000,
        seed: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{flag} needs a whole number"))
        };
        match flag.as_str() {
            "--lookups" => o.lookups = value(),
            "--seed" => o.seed = value(),
            other => panic!("unknown flag {other}; expected --lookups or --seed"),
        }
    }
    o
}

/// Zipf(s = 1) over ranks `0..n` by inverse CDF, as in accuracy_frequency.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: u32) -> Zipf {
        let mut total = 0.0;
        let cumulative = (0..n)
            .map(|r| {
                total += 1.0 / f64::from(r + 1);
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

/// The demo's traffic model: which users each server-hour saw.
struct Model {
    region_users: Zipf,
    all_users: Zipf,
}

impl Model {
    fn new() -> Model {
        Model {
            region_users: Zipf::new(USERS / REGIONS),
            all_users: Zipf::new(USERS),
        }
    }

    /// The distinct users of `server` in `hour`, ascending.
    fn users(&self, seed: u64, server: usize, hour: usize) -> Vec<u32> {
        let mut rng = StdRng::seed_from_u64(seed ^ ((server as u64) << 40) ^ hour as u64);
        let region = server as u32 % REGIONS;
        let third = USERS / REGIONS;
        let mut users: Vec<u32> = (0..VISITS_PER_HOUR)
            .map(|_| {
                if rng.random::<f64>() < 0.7 {
                    region * third + self.region_users.sample(&mut rng)
                } else {
                    // The global head, spread over all regions as in the demo.
                    self.all_users.sample(&mut rng).wrapping_mul(2_654_435_761) % USERS
                }
            })
            .collect();
        users.sort_unstable();
        users.dedup();
        users
    }
}

fn user_hash(user: u32) -> u64 {
    item_hash(format!("user{user}").as_bytes())
}

fn nobody_hash(i: u64) -> u64 {
    item_hash(format!("nobody{i}").as_bytes())
}

/// What one way of answering the week gave.
struct Row {
    name: String,
    capacity: u64,
    hashes: u32,
    bytes_per_filter: u64,
    bytes_week: u64,
    stated: f64,
    measured: f64,
    lookups: u64,
    definitely_absent: f64,
    present: Option<(u64, u64)>,
}

/// Per sized setting: how the false positives of one lookup spread over the filters.
struct Spread {
    wanted: f64,
    expected_positives: f64,
    measured_positives: f64,
    two_or_more_independent: f64,
    two_or_more_measured: f64,
    overlap_factor: f64,
}

/// Looks every absent probe and every present user up over `filters`.
fn measure_range(
    name: String,
    filters: &[Bloom],
    week: &[Vec<u32>],
    lookups: u64,
    check_present: bool,
) -> (Row, Spread) {
    let fprs: Vec<f64> = filters.iter().map(Bloom::estimated_fpr).collect();
    let (mut seen, mut positives, mut two_or_more) = (0u64, 0u64, 0u64);
    let mut stated = 0.0;
    for i in 0..lookups {
        let answer = lookup_hash(filters, nobody_hash(i));
        stated = answer.range_fpr();
        if let RangeAnswer::Seen { where_, .. } = &answer {
            seen += 1;
            positives += where_.len() as u64;
            two_or_more += u64::from(where_.len() >= 2);
        }
    }
    let present = check_present.then(|| {
        // Where each user really was.
        let mut holders: Vec<Vec<usize>> = vec![Vec::new(); USERS as usize];
        for (f, users) in week.iter().enumerate() {
            for &u in users {
                holders[u as usize].push(f);
            }
        }
        let (mut users, mut misses) = (0u64, 0u64);
        for (u, held) in holders.iter().enumerate() {
            if held.is_empty() {
                continue;
            }
            users += 1;
            let found = match lookup_hash(filters, user_hash(u as u32)) {
                RangeAnswer::Seen { where_, .. } => held.iter().all(|f| where_.contains(f)),
                RangeAnswer::DefinitelyAbsent { .. } => false,
            };
            misses += u64::from(!found);
        }
        (users, misses)
    });
    // Independent filters: P(≥ 2) = 1 − P(0) − P(1) of the Poisson-binomial.
    let none: f64 = fprs.iter().map(|f| 1.0 - f).product();
    let one = none * fprs.iter().map(|f| f / (1.0 - f)).sum::<f64>();
    let n = lookups as f64;
    let shape = &filters[0];
    (
        Row {
            name,
            capacity: shape.capacity(),
            hashes: shape.hashes(),
            bytes_per_filter: shape.size_bytes() as u64,
            bytes_week: filters.iter().map(|f| f.size_bytes() as u64).sum(),
            stated,
            measured: seen as f64 / n,
            lookups,
            definitely_absent: 1.0 - seen as f64 / n,
            present,
        },
        Spread {
            wanted: 0.0,
            expected_positives: fprs.iter().sum(),
            measured_positives: positives as f64 / n,
            two_or_more_independent: 1.0 - none - one,
            two_or_more_measured: two_or_more as f64 / n,
            overlap_factor: overlap_factor(filters),
        },
    )
}

/// The mean over pairs of filters of `P(both say maybe) / (f_i·f_j)` for a random
/// absent item, `(|S_i ∩ S_j|·m / (|S_i|·|S_j|))^k`: 1 for filters of unrelated items.
/// Pairs are consecutive hours of one server and the same hour of two servers.
fn overlap_factor(filters: &[Bloom]) -> f64 {
    let mut total = 0.0;
    let mut pairs = 0.0;
    for server in 0..SERVERS {
        for hour in (0..HOURS - 1).step_by(7) {
            for (a, b) in [
                (server * HOURS + hour, server * HOURS + hour + 1),
                (
                    server * HOURS + hour,
                    ((server + 1) % SERVERS) * HOURS + hour,
                ),
            ] {
                let (fa, fb) = (&filters[a], &filters[b]);
                total +=
                    all_maybe_probability(&[fa, fb]) / (fa.estimated_fpr() * fb.estimated_fpr());
                pairs += 1.0;
            }
        }
    }
    total / pairs
}

/// The week's filters merged into one, as the aggregator answers today, built one
/// server-hour at a time so that only two filters are ever held.
fn measure_merged(capacity: u64, fpr: f64, week: &[Vec<u32>], lookups: u64) -> Row {
    let mut merged = Bloom::new(capacity, fpr).expect("valid design point");
    for users in week {
        let mut hour = Bloom::new(capacity, fpr).expect("valid design point");
        for &u in users {
            hour.insert_hash(user_hash(u));
        }
        merged.merge(&hour).expect("same design point");
    }
    let seen = (0..lookups)
        .filter(|&i| merged.contains_hash(nobody_hash(i)))
        .count() as f64;
    let n = lookups as f64;
    Row {
        name: format!("today: merged, capacity {capacity} at {fpr}"),
        capacity,
        hashes: merged.hashes(),
        bytes_per_filter: merged.size_bytes() as u64,
        bytes_week: merged.size_bytes() as u64 * FILTERS as u64,
        stated: merged.estimated_fpr(),
        measured: seen / n,
        lookups,
        definitely_absent: 1.0 - seen / n,
        present: None,
    }
}

fn build(sizing_capacity: u64, fpr: f64, week: &[Vec<u32>]) -> Vec<Bloom> {
    week.iter()
        .map(|users| {
            let mut f = Bloom::new(sizing_capacity, fpr).expect("valid design point");
            for &u in users {
                f.insert_hash(user_hash(u));
            }
            f
        })
        .collect()
}

fn main() {
    let o = parse_options();
    let started = Instant::now();
    let model = Model::new();

    // What the metric's owner declares: the distinct users of a server-hour, from a
    // pilot day of other traffic, rounded up to a hundred.
    let pilot: Vec<usize> = (0..SERVERS)
        .flat_map(|s| (0..24).map(move |h| (s, h)))
        .map(|(s, h)| model.users(o.seed.wrapping_add(1_000_003), s, h).len())
        .collect();
    let pilot_mean = pilot.iter().sum::<usize>() as f64 / pilot.len() as f64;
    let declared = (pilot_mean / 100.0).ceil() as u64 * 100;

    let week: Vec<Vec<u32>> = (0..SERVERS)
        .flat_map(|s| (0..HOURS).map(move |h| (s, h)))
        .map(|(s, h)| model.users(o.seed, s, h))
        .collect();
    let per_filter: Vec<usize> = week.iter().map(Vec::len).collect();
    let mut everyone: Vec<u32> = week.iter().flatten().copied().collect();
    everyone.sort_unstable();
    everyone.dedup();
    println!(
        "Membership over the demo's week: {SERVERS} servers × {HOURS} hours = {FILTERS} filters, {VISITS_PER_HOUR} visits per server-hour, {USERS} users, seed {}\n",
        o.seed
    );
    println!(
        "distinct users per server-hour: mean {:.0}, min {}, max {} (pilot day: mean {pilot_mean:.0}, declared {declared}); {} distinct users in the week\n",
        per_filter.iter().sum::<usize>() as f64 / FILTERS as f64,
        per_filter.iter().min().unwrap_or(&0),
        per_filter.iter().max().unwrap_or(&0),
        everyone.len()
    );

    let mut rows = Vec::new();
    let mut spreads = Vec::new();
    let mut failures = Vec::new();
    for wanted in WANTED {
        let sizing =
            RangeSizing::for_range(FILTERS as u64, declared, wanted).expect("valid sizing");
        println!(
            "sized for {:.0}% over the week: capacity {}, fpr asked {:.3e}, {} bits, k = {}, {} bytes; at capacity {:.3e} per filter, {:.4} over the range",
            wanted * 100.0,
            sizing.capacity,
            sizing.fpr,
            sizing.bits,
            sizing.hashes,
            sizing.bytes,
            sizing.fpr_at_capacity,
            sizing.range_fpr_at_capacity
        );
        let filters = build(sizing.capacity, sizing.fpr, &week);
        let (row, mut spread) = measure_range(
            format!("range lookup, sized for {:.0}%", wanted * 100.0),
            &filters,
            &week,
            o.lookups,
            true,
        );
        spread.wanted = wanted;
        if row.definitely_absent < 1.0 - wanted {
            failures.push(format!(
                "sized for {wanted}: {:.2}% definitely absent, below {:.0}%",
                row.definitely_absent * 100.0,
                (1.0 - wanted) * 100.0
            ));
        }
        if let Some((_, misses)) = row.present
            && misses > 0
        {
            failures.push(format!("sized for {wanted}: {misses} present users missed"));
        }
        if (row.measured / row.stated - 1.0).abs() > 0.2 {
            failures.push(format!(
                "sized for {wanted}: measured {:.4} against stated {:.4}",
                row.measured, row.stated
            ));
        }
        rows.push(row);
        spreads.push(spread);
    }

    // Today's demo filters, looked up per filter instead of merged.
    let demo = build(20_000, 0.01, &week);
    let (demo_row, _) = measure_range(
        "range lookup, today's demo filters (20000 at 0.01)".into(),
        &demo,
        &week,
        COMPARISON_LOOKUPS,
        false,
    );
    drop(demo);
    rows.push(demo_row);
    rows.push(measure_merged(20_000, 0.01, &week, COMPARISON_LOOKUPS));
    rows.push(measure_merged(100_000, 0.01, &week, COMPARISON_LOOKUPS));

    println!();
    println!(
        "| answer | capacity | k | bytes per filter | bytes stored for the week | stated P(seen \\| absent) | measured | ± (1σ) | measured/stated | definitely absent | present users found |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let sigma = (r.measured * (1.0 - r.measured) / r.lookups as f64).sqrt();
        // Fewer than ten expected false positives cannot measure the rate.
        let ratio = if r.stated * r.lookups as f64 >= 10.0 {
            format!("{:.3}", r.measured / r.stated)
        } else {
            "too rare to measure".into()
        };
        let present = match r.present {
            Some((users, misses)) => format!("{} of {users}", users - misses),
            None => "—".into(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {:.3e} | {:.3e} | {:.1e} | {ratio} | {:.2}% of {} | {present} |",
            r.name,
            r.capacity,
            r.hashes,
            r.bytes_per_filter,
            r.bytes_week,
            r.stated,
            r.measured,
            sigma,
            r.definitely_absent * 100.0,
            r.lookups,
        );
    }

    println!(
        "\nHow the false positives of one absent lookup spread (filters share users, so their false positives come together):\n"
    );
    println!(
        "| sized for | Σ f_i (expected positives) | measured positives per lookup | P(≥ 2 positives), independent | measured | mean P(both) / (f_i·f_j) over filter pairs |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for s in &spreads {
        println!(
            "| {:.0}% | {:.4e} | {:.4e} | {:.2e} | {:.2e} | {:.2} |",
            s.wanted * 100.0,
            s.expected_positives,
            s.measured_positives,
            s.two_or_more_independent,
            s.two_or_more_measured,
            s.overlap_factor
        );
    }

    println!();
    println!(
        "target 1 (definitely absent ≥ 1 − wanted): {}",
        verdict(failures.iter().all(|f| !f.contains("definitely")))
    );
    println!(
        "target 2 (every present user found where it was): {}",
        verdict(failures.iter().all(|f| !f.contains("missed")))
    );
    println!(
        "target 3 (measured within 20% of stated): {}",
        verdict(failures.iter().all(|f| !f.contains("against stated")))
    );
    for f in &failures {
        println!("  FAIL: {f}");
    }
    println!("\nran in {:.1}s", started.elapsed().as_secs_f64());
    if !failures.is_empty() {
        std::process::exit(1);
    }
}

fn verdict(pass: bool) -> &'static str {
    if pass { "PASS" } else { "FAIL" }
}
