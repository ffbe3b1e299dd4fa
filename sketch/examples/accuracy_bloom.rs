//! Measures the Bloom filter against its promises (docs/ACCURACY.md):
//!
//! 1. at its design capacity, the measured false-positive rate is within 15% of the target;
//! 2. at 0.5×, 1× and 2× capacity, the rate the filter *reports* from its fill ratio
//!    (`fill^k`) is within 15% of the rate measured by probing with items never inserted.
//!
//! `cargo run --release --example accuracy_bloom -- [--trials T] [--probes Q] [--seed S]
//!  [--min-positives F] [--max-probes B]`
//!
//! Each row fills `T` fresh filters with distinct items, then probes each with rounds of
//! `Q` items that were never inserted until `F` false positives have been seen in all (or
//! `B` probes spent), so the measured rate's relative standard error, 1/√positives, is
//! about 3% at the default F = 1,000 and is printed beside each row.

use hourglass_sketch::bloom::Bloom;
use std::time::Instant;

struct Options {
    trials: u64,
    probes: u64,
    seed: u64,
    min_positives: u64,
    max_probes: u64,
}

fn parse_options() -> Options {
    let mut o = Options {
        trials: 10,
        probes: 100_000,
        seed: 0x5eed,
        min_positives: 1_000,
        max_probes: 2_000_000_000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{flag} needs a whole number"))
        };
        match flag.as_str() {
            "--trials" => o.trials = value(),
            "--probes" => o.probes = value(),
            "--seed" => o.seed = value(),
            "--min-positives" => o.min_positives = value(),
            "--max-probes" => o.max_probes = value(),
            other => panic!(
                "unknown flag {other}; expected --trials, --probes, --seed, --min-positives or --max-probes"
            ),
        }
    }
    o
}

/// Distinct 16-byte items: (trial seed, index). Inserted items and probes use disjoint
/// halves of the index space, so a probe is never a member.
fn item(seed: u64, index: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..].copy_from_slice(&index.to_le_bytes());
    bytes
}

struct Row {
    load: f64,
    measured: f64,
    reported: f64,
    positives: u64,
    probed: u64,
}

fn measure(capacity: u64, target: f64, load: f64, o: &Options) -> Row {
    let inserted = (capacity as f64 * load).round() as u64;
    let filters: Vec<(u64, Bloom)> = (0..o.trials)
        .map(|trial| {
            let seed = o.seed ^ (trial << 32) ^ capacity.rotate_left(17) ^ target.to_bits();
            let mut filter = Bloom::new(capacity, target).expect("valid design point");
            for i in 0..inserted {
                filter.insert(&item(seed, i));
            }
            (seed, filter)
        })
        .collect();
    let reported = filters.iter().map(|(_, f)| f.estimated_fpr()).sum::<f64>() / o.trials as f64;
    // Probe in rounds over all trials until the count of false positives is large enough
    // for a ±3% measurement, or the probe budget is spent.
    let (mut positives, mut probed, mut round) = (0u64, 0u64, 0u64);
    while positives < o.min_positives && probed < o.max_probes {
        for (seed, filter) in &filters {
            let base = (1 << 63) | (round * o.probes);
            positives += (base..base + o.probes)
                .filter(|&i| filter.contains(&item(*seed, i)))
                .count() as u64;
        }
        probed += o.probes * o.trials;
        round += 1;
    }
    Row {
        load,
        measured: positives as f64 / probed as f64,
        reported,
        positives,
        probed,
    }
}

fn main() {
    let o = parse_options();
    let started = Instant::now();
    println!(
        "Bloom filter accuracy: {} filters per row, probed until {} false positives (at most {} probes), seed {:#x}\n",
        o.trials, o.min_positives, o.max_probes, o.seed
    );
    println!(
        "| capacity | target p | bits | k | load | probes | measured FPR | ± (1σ) | reported FPR | measured/target | reported/measured |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut failures = Vec::new();
    for capacity in [10_000u64, 1_000_000] {
        for target in [0.1, 0.01, 0.001] {
            let shape = Bloom::new(capacity, target).expect("valid design point");
            for load in [0.5, 1.0, 2.0] {
                let row = measure(capacity, target, load, &o);
                let sigma = if row.positives > 0 {
                    row.measured / (row.positives as f64).sqrt()
                } else {
                    0.0
                };
                let vs_target = row.measured / target;
                let vs_measured = row.reported / row.measured;
                println!(
                    "| {capacity} | {target} | {} | {} | {:.1}× | {} | {:.3e} | {:.1e} | {:.3e} | {:.3} | {:.3} |",
                    shape.bits(),
                    shape.hashes(),
                    row.load,
                    row.probed,
                    row.measured,
                    sigma,
                    row.reported,
                    vs_target,
                    vs_measured
                );
                if load == 1.0 && (vs_target - 1.0).abs() > 0.15 {
                    failures.push(format!(
                        "capacity {capacity}, p {target}: measured FPR at capacity is {vs_target:.3}× target"
                    ));
                }
                if (vs_measured - 1.0).abs() > 0.15 {
                    failures.push(format!(
                        "capacity {capacity}, p {target}, load {load}: reported FPR is {vs_measured:.3}× measured"
                    ));
                }
            }
        }
    }
    println!();
    println!(
        "target 1 (measured FPR at capacity within 15% of p): {}",
        verdict(failures.iter().all(|f| !f.contains("at capacity")))
    );
    println!(
        "target 2 (reported FPR within 15% of measured at 0.5×, 1×, 2×): {}",
        verdict(failures.iter().all(|f| !f.contains("reported")))
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
