//! Accuracy of the UltraLogLog sketch against theory, beside HyperLogLog on the same items.
//!
//! For each precision, every trial hashes one stream of distinct items once and inserts
//! each hash into an `Ull` and an `Hll` of that precision, reading both estimates as the
//! stream passes each checkpoint: every n in 1..=100, then `--per-decade` log-spaced
//! cardinalities up to `--max-n`. Item `i` of trial `t` is the 8 bytes of
//! `(seed + t) << 32 | i`; trials are spread over `--threads` threads.
//!
//! Prints, per precision, the relative bias and RMSE of both sketches against their theory
//! (UltraLogLog's ML estimate `0.761/√m`, HyperLogLog's `1.04/√m`) and the 95% interval's
//! coverage, then the memory-variance product measured over the points with n > 10·m:
//! `bits per register × m × RMSE²`, 8 bits for UltraLogLog, 6 for HyperLogLog (their
//! encoded sizes). Equal error then costs memory in the ratio of the two products.
//!
//! ```text
//! cargo run --release --example accuracy_ull -- --trials 200 --max-n 10000000
//! ```

use clap::Parser;
use hourglass_sketch::hash::item_hash;
use hourglass_sketch::hll::Hll;
use hourglass_sketch::ull::{MEMORY_VARIANCE_PRODUCT, Ull};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Measures UltraLogLog's bias, RMSE and interval coverage, and HyperLogLog's beside it.
#[derive(Parser, Debug)]
struct Args {
    /// Independent trials (item streams) per cardinality.
    #[arg(long, default_value_t = 200)]
    trials: u64,
    /// The largest cardinality measured; below 2^32.
    #[arg(long, default_value_t = 10_000_000)]
    max_n: u64,
    /// Precisions to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,12,14")]
    precisions: Vec<u8>,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: u64,
    /// Log-spaced checkpoints per decade above n = 100.
    #[arg(long, default_value_t = 8)]
    per_decade: u32,
    /// Added to the trial number to make each trial's item stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Sums over trials at one checkpoint of one precision.
#[derive(Clone, Copy, Default)]
struct Sums {
    ull_error: f64,
    ull_error_squared: f64,
    ull_covered: u64,
    ull_exact: u64,
    hll_error: f64,
    hll_error_squared: f64,
    hll_covered: u64,
}

impl Sums {
    fn add(&mut self, o: &Sums) {
        self.ull_error += o.ull_error;
        self.ull_error_squared += o.ull_error_squared;
        self.ull_covered += o.ull_covered;
        self.ull_exact += o.ull_exact;
        self.hll_error += o.hll_error;
        self.hll_error_squared += o.hll_error_squared;
        self.hll_covered += o.hll_covered;
    }
}

/// Every n in 1..=100, then `per_decade` log-spaced points per decade up to `max_n`.
fn checkpoints(max_n: u64, per_decade: u32) -> Vec<u64> {
    let mut points: Vec<u64> = (1..=max_n.min(100)).collect();
    for k in 1.. {
        let n = (100.0 * 10f64.powf(f64::from(k) / f64::from(per_decade))).round() as u64;
        if n > max_n {
            break;
        }
        if points.last().is_none_or(|&last| n > last) {
            points.push(n);
        }
    }
    points
}

/// Runs trials `first, first + step, ...`; returns sums by precision, then checkpoint.
fn run_trials(
    args: &Args,
    points: &[u64],
    first: u64,
    step: u64,
    done: &AtomicU64,
) -> Vec<Vec<Sums>> {
    let mut sums = vec![vec![Sums::default(); points.len()]; args.precisions.len()];
    let mut trial = first;
    while trial < args.trials {
        let mut sketches: Vec<(Ull, Hll)> = args
            .precisions
            .iter()
            .map(|&p| (Ull::new(p).expect("checked"), Hll::new(p).expect("checked")))
            .collect();
        let stream = args.seed.wrapping_add(trial) << 32;
        let mut next = points.iter().enumerate().peekable();
        for i in 1..=args.max_n {
            let hash = item_hash(&(stream | i).to_le_bytes());
            for (ull, hll) in &mut sketches {
                ull.insert_hash(hash);
                hll.insert_hash(hash);
            }
            let Some(&(at, &n)) = next.peek() else {
                break;
            };
            if i == n {
                let truth = n as f64;
                for ((ull, hll), sums) in sketches.iter().zip(&mut sums) {
                    let slot = &mut sums[at];
                    let u = ull.estimate();
                    let error = (u.estimate - truth) / truth;
                    slot.ull_error += error;
                    slot.ull_error_squared += error * error;
                    slot.ull_covered += u64::from(u.lower95 <= truth && truth <= u.upper95);
                    slot.ull_exact += u64::from(u.estimate.round() == truth);
                    let h = hll.estimate();
                    let error = (h.estimate - truth) / truth;
                    slot.hll_error += error;
                    slot.hll_error_squared += error * error;
                    slot.hll_covered += u64::from(h.lower95 <= truth && truth <= h.upper95);
                }
                next.next();
            }
        }
        let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
        if finished.is_multiple_of((args.trials / 10).max(1)) {
            eprintln!("{finished}/{} trials", args.trials);
        }
        trial += step;
    }
    sums
}

fn main() {
    let args = Args::parse();
    for &p in &args.precisions {
        if let Err(err) = Ull::new(p) {
            eprintln!("{err}");
            std::process::exit(2);
        }
    }
    if args.trials < 2 || args.threads == 0 || args.max_n == 0 || args.max_n >= 1 << 32 {
        eprintln!("--trials must be at least 2, --threads positive, --max-n in 1..2^32");
        std::process::exit(2);
    }
    let points = checkpoints(args.max_n, args.per_decade);
    let started = Instant::now();
    let done = AtomicU64::new(0);
    let partials: Vec<Vec<Vec<Sums>>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..args.threads)
            .map(|first| {
                let (args, points, done) = (&args, &points, &done);
                scope.spawn(move || run_trials(args, points, first, args.threads, done))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .collect()
    });
    let elapsed = started.elapsed();

    let trials = args.trials as f64;
    println!(
        "# UltraLogLog accuracy: {} trials, n up to {}, {} checkpoints, {} threads, {:.1} s\n",
        args.trials,
        args.max_n,
        points.len(),
        args.threads,
        elapsed.as_secs_f64()
    );
    // The standard error of a coverage rate from T trials, and of an RMSE (≈ 1/√(2T)).
    let coverage_noise = (0.95 * 0.05 / trials).sqrt();
    let mut summary = Vec::new();
    for (pi, &p) in args.precisions.iter().enumerate() {
        let m = (1u64 << p) as f64;
        let ull_theory = (MEMORY_VARIANCE_PRODUCT / 8.0).sqrt() / m.sqrt();
        let hll_theory = 1.04 / m.sqrt();
        println!(
            "## p = {p} (m = {m}; theory: ULL {:.4}%, HLL {:.4}%)\n",
            100.0 * ull_theory,
            100.0 * hll_theory
        );
        println!(
            "| n | ULL bias / theory | ULL RMSE / theory | ULL 95% coverage | ULL exact | HLL bias / theory | HLL RMSE / theory | HLL 95% coverage |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        let (mut ull_ms, mut hll_ms, mut large, mut covered) = (0.0, 0.0, 0usize, 0u64);
        let mut worst_ull = 0.0f64;
        let mut worst_bias = 0.0f64;
        let mut min_exact = 1.0f64;
        for (at, &n) in points.iter().enumerate() {
            let mut t = Sums::default();
            for partial in &partials {
                t.add(&partial[pi][at]);
            }
            let ull_rmse = (t.ull_error_squared / trials).sqrt();
            let hll_rmse = (t.hll_error_squared / trials).sqrt();
            let ull_bias = t.ull_error / trials;
            worst_bias = worst_bias.max(ull_bias.abs() / ull_theory);
            if n < 100 {
                min_exact = min_exact.min(t.ull_exact as f64 / trials);
            }
            if n as f64 > 10.0 * m {
                ull_ms += t.ull_error_squared / trials;
                hll_ms += t.hll_error_squared / trials;
                covered += t.ull_covered;
                large += 1;
                worst_ull = worst_ull.max(ull_rmse / ull_theory);
            }
            let shown = n <= 10 || n == 100 || n > 100;
            if shown {
                println!(
                    "| {n} | {:+.3} | {:.3} | {:.1}% | {} | {:+.3} | {:.3} | {:.1}% |",
                    ull_bias / ull_theory,
                    ull_rmse / ull_theory,
                    100.0 * t.ull_covered as f64 / trials,
                    if n <= 100 {
                        format!("{:.1}%", 100.0 * t.ull_exact as f64 / trials)
                    } else {
                        String::new()
                    },
                    t.hll_error / trials / hll_theory,
                    hll_rmse / hll_theory,
                    100.0 * t.hll_covered as f64 / trials,
                );
            }
        }
        println!();
        if large > 0 {
            let ull_mvp = 8.0 * m * ull_ms / large as f64;
            let hll_mvp = 6.0 * m * hll_ms / large as f64;
            summary.push(format!(
                "| {p} | {large} | {:.3} | {ull_mvp:.3} | {hll_mvp:.3} | {:.3} ({:.1}% fewer bytes) | {:.2}% (±{:.2}) | {worst_ull:.3} | {worst_bias:.3} | {:.1}% |",
                (2.0 / trials).sqrt(),
                ull_mvp / hll_mvp,
                100.0 * (1.0 - ull_mvp / hll_mvp),
                100.0 * covered as f64 / (trials * large as f64),
                100.0 * coverage_noise / (large as f64).sqrt(),
                100.0 * min_exact,
            ));
        }
    }
    println!("## Summary over n > 10·m\n");
    println!(
        "MVP = bits per register × m × mean RMSE² (theory: ULL {MEMORY_VARIANCE_PRODUCT:.3}, HLL 6 × 1.04² = 6.490). \
         Bytes at equal error are in the ratio of the MVPs.\n"
    );
    println!(
        "| p | points | rel. noise of one point's MSE, √(2/T) | ULL MVP | HLL MVP | ULL/HLL bytes at equal error | ULL 95% coverage | max ULL RMSE/theory | max abs(ULL bias)/theory (all n) | min ULL exact (n < 100) |"
    );
    println!("|---:|---:|---:|---:|---:|---|---|---:|---:|---:|");
    for row in summary {
        println!("{row}");
    }
}
