//! Accuracy of the joint overlap estimate of two HyperLogLog sketches against
//! inclusion–exclusion.
//!
//! Every trial draws two sets with `|A| = |B| = n` sharing `f·n` items (the overlap
//! fraction `f = |A ∩ B| / |A|`), as seeded splitmix64 hash streams fed to
//! `Hll::insert_hash` at the highest precision asked for; lower precisions are folded
//! from it (folding is exact). For each precision it records the error of
//! `overlap::estimate_pair` and of `overlap::inclusion_exclusion` (clamped at 0) on
//! `|A ∩ B|`, whether the stated 95% interval covers the truth, and the verdict; among
//! the trials declared estimable, also whether the plain normal (Wald) interval
//! `estimate ± 1.96·σ` would have covered it (the reported lower end is selective, see
//! the `overlap` module docs). It records the coverage of the union, Jaccard and retained
//! share (`|A ∩ B| / |A| = f`) intervals too.
//!
//! Trials per cell are `--trials`, fewer for large n so that a cell inserts at most
//! `--max-inserts` items; they are spread over `--threads` threads.
//!
//! ```text
//! cargo run --release -p hourglass-sketch --example accuracy_overlap -- --trials 1000
//! ```

use clap::Parser;
use hourglass_sketch::Z95;
use hourglass_sketch::hll::Hll;
use hourglass_sketch::overlap::{Verdict, estimate_pair, inclusion_exclusion};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Measures the joint overlap estimator's error, interval coverage and verdicts.
#[derive(Parser, Debug)]
struct Args {
    /// Trials per (n, f) cell, before the `--max-inserts` limit.
    #[arg(long, default_value_t = 1000)]
    trials: u64,
    /// The most items one cell inserts over all its trials (2·n per trial).
    #[arg(long, default_value_t = 2_000_000_000)]
    max_inserts: u64,
    /// Set sizes n = |A| = |B|, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000,10000,100000,1000000,10000000"
    )]
    sizes: Vec<u64>,
    /// Overlap fractions f = |A ∩ B| / |A|, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0.001,0.01,0.1,0.5,0.9")]
    fractions: Vec<f64>,
    /// Precisions, comma-separated; sketches are built at the largest and folded.
    #[arg(long, value_delimiter = ',', default_value = "14,12")]
    precisions: Vec<u8>,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Seed of the hash streams.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// A seeded stream of 64-bit hashes (splitmix64): distinct in practice, uniform, cheap.
struct Hashes(u64);

impl Hashes {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Sums over the trials of one cell at one precision.
#[derive(Clone, Copy, Default)]
struct Sums {
    trials: u64,
    joint_error: f64,
    joint_error_squared: f64,
    naive_error_squared: f64,
    stated_variance: f64,
    covered: u64,
    estimable: u64,
    estimable_covered: u64,
    /// Of the estimable trials, those the plain normal (Wald) interval
    /// `estimate ± 1.96·σ` would cover.
    estimable_wald_covered: u64,
    retained_covered: u64,
    estimable_retained_covered: u64,
    /// Estimable trials whose intersection interval still starts at 0.
    estimable_from_zero: u64,
    too_small: u64,
    union_covered: u64,
    jaccard_covered: u64,
    /// Of the too-small trials, those whose interval covers the truth.
    too_small_covered: u64,
    estimate_time: Duration,
}

impl Sums {
    fn add(&mut self, o: &Sums) {
        self.trials += o.trials;
        self.joint_error += o.joint_error;
        self.joint_error_squared += o.joint_error_squared;
        self.naive_error_squared += o.naive_error_squared;
        self.stated_variance += o.stated_variance;
        self.covered += o.covered;
        self.estimable += o.estimable;
        self.estimable_covered += o.estimable_covered;
        self.estimable_wald_covered += o.estimable_wald_covered;
        self.retained_covered += o.retained_covered;
        self.estimable_retained_covered += o.estimable_retained_covered;
        self.estimable_from_zero += o.estimable_from_zero;
        self.too_small += o.too_small;
        self.union_covered += o.union_covered;
        self.jaccard_covered += o.jaccard_covered;
        self.too_small_covered += o.too_small_covered;
        self.estimate_time += o.estimate_time;
    }
}

/// One cell of the grid: a size and an overlap fraction.
#[derive(Clone, Copy)]
struct Cell {
    n: u64,
    fraction: f64,
    trials: u64,
}

impl Cell {
    fn shared(&self) -> u64 {
        (self.fraction * self.n as f64).round() as u64
    }
}

/// Runs one trial of `cell`, adding to `sums[precision index]`.
fn run_trial(args: &Args, cell: &Cell, cell_index: usize, trial: u64, sums: &mut [Sums]) {
    let top = *args.precisions.iter().max().expect("checked non-empty");
    let mut hashes = Hashes(
        args.seed
            .wrapping_mul(0x2545_f491_4f6c_dd1d)
            .wrapping_add((cell_index as u64) << 40 | trial),
    );
    // Mix the counter's start so that streams of neighbouring trials do not overlap.
    hashes.0 = hashes.next();
    let (mut a, mut b) = (
        Hll::new(top).expect("checked"),
        Hll::new(top).expect("checked"),
    );
    let shared = cell.shared();
    for _ in 0..shared {
        let h = hashes.next();
        a.insert_hash(h);
        b.insert_hash(h);
    }
    for _ in shared..cell.n {
        a.insert_hash(hashes.next());
    }
    for _ in shared..cell.n {
        b.insert_hash(hashes.next());
    }
    let truth = shared as f64;
    let union_truth = (2 * cell.n - shared) as f64;
    let jaccard_truth = truth / union_truth;
    let retained_truth = truth / cell.n as f64;
    for (&p, slot) in args.precisions.iter().zip(sums.iter_mut()) {
        let (a, b) = if p == top {
            (a.clone(), b.clone())
        } else {
            (
                a.fold_to(p).expect("checked"),
                b.fold_to(p).expect("checked"),
            )
        };
        let started = Instant::now();
        let overlap = estimate_pair(&a, &b).expect("same kind");
        slot.estimate_time += started.elapsed();
        let naive = inclusion_exclusion(&a, &b).expect("same kind");
        let x = overlap.intersection;
        let covers = x.lower95 <= truth && truth <= x.upper95;
        let error = x.estimate - truth;
        let naive_error = naive.intersection.max(0.0) - truth;
        slot.trials += 1;
        slot.joint_error += error;
        slot.joint_error_squared += error * error;
        slot.naive_error_squared += naive_error * naive_error;
        slot.stated_variance += x.std_error * x.std_error;
        slot.covered += u64::from(covers);
        let r = overlap.retained;
        let retained_covers = r.lower95 <= retained_truth && retained_truth <= r.upper95;
        slot.retained_covered += u64::from(retained_covers);
        match overlap.verdict {
            Verdict::Estimable => {
                slot.estimable += 1;
                slot.estimable_covered += u64::from(covers);
                let wald_lower = (x.estimate - Z95 * x.std_error).max(0.0);
                slot.estimable_wald_covered += u64::from(wald_lower <= truth && truth <= x.upper95);
                slot.estimable_retained_covered += u64::from(retained_covers);
                slot.estimable_from_zero += u64::from(x.lower95 <= 0.0);
            }
            Verdict::TooSmall => {
                slot.too_small += 1;
                slot.too_small_covered += u64::from(covers);
            }
            Verdict::Empty | Verdict::Saturated => {}
        }
        let u = overlap.union;
        slot.union_covered += u64::from(u.lower95 <= union_truth && union_truth <= u.upper95);
        let j = overlap.jaccard;
        slot.jaccard_covered += u64::from(j.lower95 <= jaccard_truth && jaccard_truth <= j.upper95);
    }
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "–".to_string()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / whole as f64)
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
    if args.precisions.is_empty()
        || args.trials == 0
        || args.threads == 0
        || args.sizes.iter().any(|&n| n == 0 || n >= 1 << 40)
        || args.fractions.iter().any(|f| !(0.0..=1.0).contains(f))
    {
        eprintln!(
            "need precisions, --trials and --threads > 0, sizes in 1..2^40, fractions in [0, 1]"
        );
        std::process::exit(2);
    }
    let cells: Vec<Cell> = args
        .sizes
        .iter()
        .flat_map(|&n| {
            let trials = args.trials.min(args.max_inserts / (2 * n)).max(10);
            args.fractions.iter().map(move |&fraction| Cell {
                n,
                fraction,
                trials,
            })
        })
        .collect();
    let jobs: Vec<(usize, u64)> = cells
        .iter()
        .enumerate()
        .flat_map(|(c, cell)| (0..cell.trials).map(move |t| (c, t)))
        .collect();
    let next_job = AtomicUsize::new(0);
    let started = Instant::now();
    let partials: Vec<Vec<Vec<Sums>>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..args.threads)
            .map(|_| {
                let (args, cells, jobs, next_job) = (&args, &cells, &jobs, &next_job);
                scope.spawn(move || {
                    let mut sums = vec![vec![Sums::default(); args.precisions.len()]; cells.len()];
                    loop {
                        let at = next_job.fetch_add(1, Ordering::Relaxed);
                        let Some(&(c, trial)) = jobs.get(at) else {
                            break;
                        };
                        run_trial(args, &cells[c], c, trial, &mut sums[c]);
                        if (at + 1).is_multiple_of((jobs.len() / 10).max(1)) {
                            eprintln!("{}/{} trials", at + 1, jobs.len());
                        }
                    }
                    sums
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .collect()
    });
    let elapsed = started.elapsed();

    println!(
        "# Overlap accuracy: |A| = |B| = n, |A ∩ B| = f·n; {} trials per cell (fewer above n = {}), {} threads, {:.1} s\n",
        args.trials,
        args.max_inserts / (2 * args.trials),
        args.threads,
        elapsed.as_secs_f64()
    );
    for (pi, &p) in args.precisions.iter().enumerate() {
        println!(
            "## p = {p} (m = {}, single-sketch error 1.04/√m = {:.2}%)\n",
            1u64 << p,
            104.0 / f64::from(1u32 << p).sqrt()
        );
        println!(
            "| n | f | abs(A∩B) | trials | joint rel. RMSE | joint rel. bias | incl.–excl. rel. RMSE | incl.–excl. / joint | stated σ / RMSE | coverage, all | too small | coverage, estimable | Wald coverage, estimable | estimable, lower end 0 | estimable and missed | union coverage | Jaccard coverage | retained coverage, all | retained coverage, estimable | µs per estimate |"
        );
        println!(
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for (c, cell) in cells.iter().enumerate() {
            let mut total = Sums::default();
            for partial in &partials {
                total.add(&partial[c][pi]);
            }
            let t = total.trials as f64;
            let truth = cell.shared() as f64;
            let rmse = (total.joint_error_squared / t).sqrt();
            let naive_rmse = (total.naive_error_squared / t).sqrt();
            let relative = |v: f64| {
                if truth > 0.0 {
                    format!("{:.2}%", 100.0 * v / truth)
                } else {
                    format!("{v:.1} (abs.)")
                }
            };
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |",
                cell.n,
                cell.fraction,
                cell.shared(),
                total.trials,
                relative(rmse),
                relative(total.joint_error / t),
                relative(naive_rmse),
                naive_rmse / rmse,
                (total.stated_variance / t).sqrt() / rmse,
                percent(total.covered, total.trials),
                percent(total.too_small, total.trials),
                percent(total.estimable_covered, total.estimable),
                percent(total.estimable_wald_covered, total.estimable),
                percent(total.estimable_from_zero, total.trials),
                percent(total.estimable - total.estimable_covered, total.trials),
                percent(total.union_covered, total.trials),
                percent(total.jaccard_covered, total.trials),
                percent(total.retained_covered, total.trials),
                percent(total.estimable_retained_covered, total.estimable),
                total.estimate_time.as_secs_f64() * 1e6 / t,
            );
        }
        println!();
    }
}
