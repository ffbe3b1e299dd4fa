//! Accuracy of the distinct (HyperLogLog) sketch against theory.
//!
//! For each precision, every trial inserts one stream of distinct items through
//! `Hll::insert` and reads the estimate as the stream passes each checkpoint: every n in
//! 1..=100, then `--per-decade` log-spaced cardinalities up to `--max-n`. Reusing one
//! stream per trial costs one pass of `max-n` inserts for all checkpoints, instead of one
//! pass per checkpoint. Trials are independent (item `i` of trial `t` is the 8 bytes of
//! `(seed + t) << 32 | i`), and are spread over `--threads` threads.
//!
//! Prints a markdown table per precision and a verdict per target:
//! * RMSE ≤ 1.05 × theory (1.04/√m) for n > 10·m;
//! * |mean relative bias| ≤ 0.1 × theory at every n;
//! * for n < 100, the estimate rounds to the true count in ≥ 99% of trials.
//!
//! ```text
//! cargo run --release --example accuracy_hll -- --trials 1000 --max-n 10000000
//! ```

use clap::Parser;
use hourglass_sketch::hll::Hll;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Measures the HyperLogLog estimate's bias and RMSE against 1.04/√m.
#[derive(Parser, Debug)]
struct Args {
    /// Independent trials (item streams) per cardinality.
    #[arg(long, default_value_t = 1000)]
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
    #[arg(long, default_value_t = 16)]
    per_decade: u32,
    /// Added to the trial number to make each trial's item stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Sums over trials at one checkpoint of one precision.
#[derive(Clone, Copy, Default)]
struct Sums {
    relative_error: f64,
    relative_error_squared: f64,
    exact: u64,
}

impl Sums {
    fn add(&mut self, other: &Sums) {
        self.relative_error += other.relative_error;
        self.relative_error_squared += other.relative_error_squared;
        self.exact += other.exact;
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

/// Runs trials `first, first + step, ...` below `trials`; returns sums indexed by
/// precision, then checkpoint.
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
        let mut sketches: Vec<Hll> = args
            .precisions
            .iter()
            .map(|&p| Hll::new(p).expect("precisions were checked"))
            .collect();
        let stream = args.seed.wrapping_add(trial) << 32;
        let mut next = points.iter().enumerate().peekable();
        for i in 1..=args.max_n {
            let item = (stream | i).to_le_bytes();
            for sketch in &mut sketches {
                sketch.insert(&item);
            }
            let Some(&(at, &n)) = next.peek() else {
                break;
            };
            if i == n {
                for (sketch, sums) in sketches.iter().zip(&mut sums) {
                    let estimate = sketch.estimate().estimate;
                    let error = (estimate - n as f64) / n as f64;
                    let slot = &mut sums[at];
                    slot.relative_error += error;
                    slot.relative_error_squared += error * error;
                    slot.exact += u64::from(estimate.round() == n as f64);
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

/// One row of results.
struct Row {
    n: u64,
    bias: f64,
    rmse: f64,
    /// Standard error of the bias measurement: the spread over √trials.
    bias_noise: f64,
    exact: f64,
}

impl Row {
    /// The bias in units of its own standard error, to tell bias from noise; blank where
    /// the estimates hardly vary (small n, where the bias is a deterministic offset of
    /// the estimator and the ratio says nothing).
    fn bias_in_std_errors(&self, trials: f64) -> String {
        if self.bias_noise * trials.sqrt() < 1e-6 {
            "–".to_string()
        } else {
            format!("{:+.2}", self.bias / self.bias_noise)
        }
    }
}

fn main() {
    let args = Args::parse();
    for &p in &args.precisions {
        if let Err(err) = Hll::new(p) {
            eprintln!("{err}");
            std::process::exit(2);
        }
    }
    if args.trials == 0 || args.threads == 0 || args.max_n == 0 || args.max_n >= 1 << 32 {
        eprintln!("--trials and --threads must be positive, --max-n in 1..2^32");
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
        "# HyperLogLog accuracy: {} trials, n up to {}, {} checkpoints, {} threads, {:.1} s\n",
        args.trials,
        args.max_n,
        points.len(),
        args.threads,
        elapsed.as_secs_f64()
    );
    let mut verdicts = Vec::new();
    for (pi, &p) in args.precisions.iter().enumerate() {
        let m = (1u64 << p) as f64;
        let theory = 1.04 / m.sqrt();
        let rows: Vec<Row> = points
            .iter()
            .enumerate()
            .map(|(at, &n)| {
                let mut total = Sums::default();
                for partial in &partials {
                    total.add(&partial[pi][at]);
                }
                let bias = total.relative_error / trials;
                let mean_square = total.relative_error_squared / trials;
                let spread = (mean_square - bias * bias).max(0.0).sqrt();
                Row {
                    n,
                    bias,
                    rmse: mean_square.sqrt(),
                    bias_noise: spread / trials.sqrt(),
                    exact: total.exact as f64 / trials,
                }
            })
            .collect();

        println!(
            "## p = {p} (m = {m}, theory 1.04/√m = {:.4}%)\n",
            100.0 * theory
        );
        println!(
            "| n | mean rel. bias | bias / theory | bias / its std. error | RMSE / theory | exact |"
        );
        println!("|---:|---:|---:|---:|---:|---:|");
        for row in &rows {
            let exact = if row.n <= 100 {
                format!("{:.2}%", 100.0 * row.exact)
            } else {
                String::new()
            };
            println!(
                "| {} | {:+.5}% | {:+.3} | {} | {:.3} | {exact} |",
                row.n,
                100.0 * row.bias,
                row.bias / theory,
                row.bias_in_std_errors(trials),
                row.rmse / theory,
            );
        }
        println!();

        let large: Vec<&Row> = rows.iter().filter(|r| r.n as f64 > 10.0 * m).collect();
        let worst_rmse = large
            .iter()
            .map(|r| r.rmse / theory)
            .fold(f64::NAN, f64::max);
        let worst_bias = rows
            .iter()
            .max_by(|a, b| a.bias.abs().total_cmp(&b.bias.abs()))
            .expect("at least one checkpoint");
        let small: Vec<&Row> = rows.iter().filter(|r| r.n < 100).collect();
        let worst_exact = small
            .iter()
            .min_by(|a, b| a.exact.total_cmp(&b.exact))
            .map(|r| (r.n, r.exact));
        let pass = |ok: bool| if ok { "PASS" } else { "FAIL" };
        verdicts.push(format!(
            "| {p} | {} max RMSE/theory {:.3} over {} points with n > {} (noise ±{:.3}) | {} max abs(bias)/theory {:.3} at n = {} ({} std. errors; noise ±{:.3}) | {} |",
            pass(large.is_empty() || worst_rmse <= 1.05),
            worst_rmse,
            large.len(),
            10 * (1u64 << p),
            // The relative standard error of an RMSE from T samples is about 1/√(2T).
            1.0 / (2.0 * trials).sqrt(),
            pass(worst_bias.bias.abs() <= 0.1 * theory),
            worst_bias.bias.abs() / theory,
            worst_bias.n,
            worst_bias.bias_in_std_errors(trials),
            worst_bias.bias_noise / theory,
            match worst_exact {
                Some((n, exact)) => format!(
                    "{} min exact {:.2}% at n = {n}",
                    pass(exact >= 0.99),
                    100.0 * exact
                ),
                None => "no n < 100 measured".to_string(),
            },
        ));
    }
    println!("## Verdicts\n");
    println!(
        "| p | RMSE ≤ 1.05 × theory for n > 10·m | abs(bias) ≤ 0.1 × theory at every n | n < 100 exact in ≥ 99% |"
    );
    println!("|---:|---|---|---|");
    for verdict in verdicts {
        println!("{verdict}");
    }
}
