//! `hourglass sketch build | merge | inspect`: sketches as files.
//!
//! The forms and the `--json` keys are an interface scripts are written against: change
//! them only with a deprecation.

use super::numbers::{count, grouped, item_width, percent};
use super::query::distinct_text;
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use hourglass_sketch::Kind;
use hourglass_sketch::Sketch;
use hourglass_sketch::bloom::{self, Bloom, Health};
use hourglass_sketch::distinct::{Distinct, DistinctForm};
use hourglass_sketch::frequency::{self, Frequency, FrequencyParams};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Subcommand)]
pub(crate) enum SketchCommand {
    /// Build a sketch from items read from stdin, one per line.
    ///
    /// Each line (without its `\n` or `\r\n`) is one item; an empty line is the empty item.
    /// Example: `hourglass sketch build --kind distinct -o users.hgs < users.log`
    Build(BuildArgs),
    /// Merge sketches of the same kind and parameters into one.
    ///
    /// Distinct sketches of different precisions merge at the smallest precision, and a
    /// HyperLogLog with an UltraLogLog merges to a HyperLogLog.
    Merge(MergeArgs),
    /// Show what a sketch says: estimates with their error bars.
    Inspect(InspectArgs),
}

#[derive(Debug, Args)]
pub(crate) struct BuildArgs {
    /// Which kind of sketch: distinct (HyperLogLog), frequency (Count-Min + frequent
    /// items) or membership (Bloom filter).
    #[arg(long, env = "HOURGLASS_KIND")]
    kind: Kind,
    /// distinct: which sketch, hll (HyperLogLog: standard error 1.04/√(2^P) in 0.75·2^P
    /// bytes) or ull (UltraLogLog: 0.761/√(2^P) in 2^P bytes, about 28% fewer bytes than
    /// hll at the same error). [default: hll]
    #[arg(long, env = "HOURGLASS_FORM")]
    form: Option<DistinctForm>,
    /// distinct: precision P, 4 to 18 (2^P registers); the standard error at 14 is 0.81%
    /// for hll, 0.59% for ull. [default: 14 for hll, 13 for ull (0.84%)]
    #[arg(long, env = "HOURGLASS_PRECISION")]
    precision: Option<u8>,
    /// frequency: error bound ε; estimates are over by at most ε·N (N = total count) with
    /// probability 1−δ, and every item above ε·N appears in the top-K. [default: 0.001]
    #[arg(long, env = "HOURGLASS_EPSILON")]
    epsilon: Option<f64>,
    /// frequency: failure probability δ of the ε·N bound. [default: 0.01]
    #[arg(long, env = "HOURGLASS_DELTA")]
    delta: Option<f64>,
    /// membership: the number of distinct items the filter is designed for (required).
    #[arg(long, env = "HOURGLASS_CAPACITY")]
    capacity: Option<u64>,
    /// membership: target false-positive rate at capacity. [default: 0.01]
    #[arg(long, env = "HOURGLASS_FPR")]
    fpr: Option<f64>,
    /// Write the sketch here instead of stdout.
    #[arg(short = 'o', long = "output", env = "HOURGLASS_OUTPUT")]
    output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct MergeArgs {
    /// Sketch files to merge (at least one).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write the merged sketch here instead of stdout.
    #[arg(short = 'o', long = "output", env = "HOURGLASS_OUTPUT")]
    output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// The sketch file (`-` for stdin).
    file: PathBuf,
    /// frequency: the item to estimate; membership: the item to look up.
    #[arg(long)]
    item: Option<String>,
    /// frequency: how many of the heaviest items to list. [default: 10 when no --item]
    #[arg(long = "k")]
    k: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: SketchCommand) -> anyhow::Result<()> {
    match cmd {
        SketchCommand::Build(args) => build(args),
        SketchCommand::Merge(args) => merge(args),
        SketchCommand::Inspect(args) => inspect(args),
    }
}

fn new_sketch(args: &BuildArgs) -> anyhow::Result<Sketch> {
    let misplaced = |flag: &str, kind: &str| {
        anyhow::anyhow!("{flag} applies to --kind {kind}, not --kind {}", args.kind)
    };
    if args.kind != Kind::Distinct && args.precision.is_some() {
        return Err(misplaced("--precision", "distinct"));
    }
    if args.kind != Kind::Distinct && args.form.is_some() {
        return Err(misplaced("--form", "distinct"));
    }
    if args.kind != Kind::Frequency && (args.epsilon.is_some() || args.delta.is_some()) {
        return Err(misplaced("--epsilon/--delta", "frequency"));
    }
    if args.kind != Kind::Membership && (args.capacity.is_some() || args.fpr.is_some()) {
        return Err(misplaced("--capacity/--fpr", "membership"));
    }
    Ok(match args.kind {
        Kind::Distinct => {
            let form = args.form.unwrap_or(DistinctForm::Hll);
            Sketch::Distinct(Distinct::new(
                form,
                args.precision.unwrap_or(form.default_precision()),
            )?)
        }
        Kind::Frequency => {
            let params = FrequencyParams::from_error(
                args.epsilon.unwrap_or(frequency::DEFAULT_EPSILON),
                args.delta.unwrap_or(frequency::DEFAULT_DELTA),
            )?;
            Sketch::Frequency(Frequency::new(params)?)
        }
        Kind::Membership => {
            let capacity = args.capacity.context(
                "--kind membership needs --capacity N: the number of distinct items the filter is designed for",
            )?;
            Sketch::Membership(Bloom::new(
                capacity,
                args.fpr.unwrap_or(bloom::DEFAULT_FPR),
            )?)
        }
    })
}

fn build(args: BuildArgs) -> anyhow::Result<()> {
    let mut sketch = new_sketch(&args)?;
    check_output(args.output.as_deref())?;
    let stdin = std::io::stdin();
    let mut input = BufReader::with_capacity(1 << 20, stdin.lock());
    let mut line = Vec::with_capacity(256);
    let mut progress = Progress::new();
    let mut items: u64 = 0;
    loop {
        line.clear();
        let n = input
            .read_until(b'\n', &mut line)
            .context("reading items from stdin")?;
        if n == 0 {
            break;
        }
        let item = strip_newline(&line);
        sketch
            .insert(item)
            .with_context(|| format!("item on line {}", items + 1))?;
        items += 1;
        progress.tick(items, n);
    }
    progress.finish(items);
    write_sketch(&sketch, args.output.as_deref())
}

fn strip_newline(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn merge(args: MergeArgs) -> anyhow::Result<()> {
    check_output(args.output.as_deref())?;
    let mut files = args.files.iter();
    let first = files.next().expect("clap requires one file");
    let mut merged = read_sketch(first)?;
    for file in files {
        let next = read_sketch(file)?;
        merged
            .merge(&next)
            .with_context(|| format!("merging {} into {}", file.display(), first.display()))?;
    }
    write_sketch(&merged, args.output.as_deref())
}

fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let sketch = read_sketch(&args.file)?;
    if sketch.kind() == Kind::Distinct && args.item.is_some() {
        bail!("--item does not apply to a distinct sketch: it counts items, it cannot look one up");
    }
    if sketch.kind() != Kind::Frequency && args.k.is_some() {
        bail!(
            "--k applies to frequency sketches only; this is a {} sketch",
            sketch.kind()
        );
    }
    let encoded_len = sketch.encode().len();
    let (value, text) = match &sketch {
        Sketch::Distinct(s) => describe_distinct(s),
        Sketch::Frequency(s) => describe_frequency(s, args.item.as_deref(), args.k),
        Sketch::Membership(s) => describe_membership(s, args.item.as_deref()),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        if let Sketch::Membership(s) = &sketch {
            // JSON readers get the numbers; the warning still reaches a person.
            if s.health() != Health::Healthy {
                eprintln!("hourglass: warning: membership sketch is {}", s.health());
            }
        }
        writeln!(out, "{value}")?;
    } else {
        write!(out, "{text}")?;
        writeln!(
            out,
            "{:<13} {} bytes encoded",
            "size",
            grouped(encoded_len as u64)
        )?;
    }
    Ok(())
}

fn describe_distinct(s: &Distinct) -> (Value, String) {
    let e = s.estimate();
    let value = json!({
        "kind": "distinct",
        "form": s.form().name(),
        "estimate": e.estimate,
        "std_error": e.std_error,
        "lower95": e.lower95,
        "upper95": e.upper95,
    });
    let text = format!(
        "{:<13} distinct ({}, precision {}, {})\n{:<13} {}\n{:<13} {}\n",
        "kind",
        s.form().long_name(),
        s.precision(),
        if s.is_sparse() { "sparse" } else { "dense" },
        "estimate",
        distinct_text(&value),
        "std error",
        count(e.std_error),
    );
    (value, text)
}

fn describe_frequency(s: &Frequency, item: Option<&str>, k: Option<usize>) -> (Value, String) {
    let cm = s.count_min();
    let mut text = format!(
        "{:<13} frequency (Count-Min {} × {}, ε = {}, δ = {:.3}; frequent items: {} counters{})\n{:<13} {}\n",
        "kind",
        cm.width(),
        cm.depth(),
        short_float(cm.epsilon()),
        cm.delta(),
        grouped(s.frequent_items().capacity() as u64),
        if cm.is_conservative() {
            ", conservative update"
        } else {
            ""
        },
        "total (N)",
        grouped(cm.total()),
    );
    let mut value = json!({ "kind": "frequency" });
    if let Some(item) = item {
        let e = s.estimate(item.as_bytes());
        value["item"] = json!(item);
        value["estimate"] = json!(e.estimate);
        value["max_overcount"] = json!(e.max_overcount);
        value["total"] = json!(e.total);
        text += &format!(
            "{:<13} {item:?}\n{:<13} {} (never under; at most {} over with probability {:.1}%)\n",
            "item",
            "estimate",
            grouped(e.estimate),
            grouped(e.max_overcount),
            (1.0 - cm.delta()) * 100.0,
        );
    }
    if k.is_some() || item.is_none() {
        let top = s.top_k(k.unwrap_or(10));
        value["items"] = top
            .iter()
            .map(|t| {
                json!({
                    "item": String::from_utf8_lossy(&t.item),
                    "estimate": t.estimate,
                    "lower": t.lower,
                    "upper": t.upper,
                })
            })
            .collect();
        if item.is_none() {
            value["total"] = json!(cm.total());
        }
        text += &top_table(&top);
    }
    (value, text)
}

fn top_table(top: &[hourglass_sketch::frequency::TopItem]) -> String {
    if top.is_empty() {
        return format!("{:<13} none\n", "top items");
    }
    let names: Vec<String> = top
        .iter()
        .map(|t| format!("{:?}", String::from_utf8_lossy(&t.item)))
        .collect();
    let width = item_width(&names);
    let mut text = format!("top {} items:\n", top.len());
    text += &format!(
        "  {:<width$}  {:>14}  {:>14}  {:>14}\n",
        "item", "estimate", "lower", "upper"
    );
    for (t, name) in top.iter().zip(&names) {
        text += &format!(
            "  {name:<width$}  {:>14}  {:>14}  {:>14}\n",
            grouped(t.estimate),
            grouped(t.lower),
            grouped(t.upper),
        );
    }
    text
}

fn describe_membership(s: &Bloom, item: Option<&str>) -> (Value, String) {
    let mut value = json!({
        "kind": "membership",
        "fill_ratio": s.fill_ratio(),
        "estimated_fpr": s.estimated_fpr(),
    });
    let mut text = format!(
        "{:<13} membership (Bloom filter, {} bits, {} hashes; designed for {} items at {} false positives)\n\
         {:<13} {}\n{:<13} {}\n{:<13} about {} distinct items\n{:<13} {}\n",
        "kind",
        grouped(s.bits()),
        s.hashes(),
        grouped(s.capacity()),
        percent(s.target_fpr()),
        "fill ratio",
        percent(s.fill_ratio()),
        "est. FPR",
        percent(s.estimated_fpr()),
        "holds",
        count(s.estimated_items()),
        "health",
        s.health(),
    );
    if let Some(item) = item {
        let maybe = s.contains(item.as_bytes());
        value["maybe_present"] = json!(maybe);
        text += &format!(
            "{:<13} {item:?}: {}\n",
            "item",
            if maybe {
                format!(
                    "maybe present (wrong with probability {})",
                    percent(s.estimated_fpr())
                )
            } else {
                "definitely absent".to_string()
            }
        );
    }
    (value, text)
}

/// A float with no trailing noise: `0.001` rather than `0.0010002`.
fn short_float(x: f64) -> String {
    format!("{:.3e}", x)
        .parse::<f64>()
        .map(|v| v.to_string())
        .unwrap_or_else(|_| x.to_string())
}

fn read_sketch(path: &Path) -> anyhow::Result<Sketch> {
    let bytes = if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading a sketch from stdin")?;
        buf
    } else {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
    };
    Sketch::decode(&bytes).with_context(|| format!("{} is not a valid sketch", path.display()))
}

/// Refuses, before any work, to spray binary onto a terminal.
fn check_output(output: Option<&Path>) -> anyhow::Result<()> {
    if output.is_none() && std::io::stdout().is_terminal() {
        bail!("refusing to write a binary sketch to the terminal: use -o FILE or redirect stdout");
    }
    Ok(())
}

fn write_sketch(sketch: &Sketch, output: Option<&Path>) -> anyhow::Result<()> {
    let bytes = sketch.encode();
    match output {
        Some(path) => {
            std::fs::write(path, &bytes).with_context(|| format!("cannot write {}", path.display()))
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes)
                .and_then(|()| out.flush())
                .context("writing the sketch to stdout")
        }
    }
}

/// Progress on stderr for long builds, only when a person is watching.
struct Progress {
    enabled: bool,
    started: Instant,
    last: Instant,
    bytes: u64,
}

impl Progress {
    fn new() -> Progress {
        let now = Instant::now();
        Progress {
            enabled: std::io::stderr().is_terminal(),
            started: now,
            last: now,
            bytes: 0,
        }
    }

    fn tick(&mut self, items: u64, bytes: usize) {
        self.bytes += bytes as u64;
        // Checking the clock every item would cost more than the sketch update.
        if !self.enabled
            || !items.is_multiple_of(65_536)
            || self.last.elapsed() < Duration::from_secs(1)
        {
            return;
        }
        self.last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64();
        eprint!(
            "\r{} items, {} MB read, {:.0} MB/s   ",
            grouped(items),
            grouped(self.bytes >> 20),
            (self.bytes as f64 / (1 << 20) as f64) / secs
        );
    }

    fn finish(&self, items: u64) {
        if self.enabled && self.started.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "\r{} items read in {:.1}s                ",
                grouped(items),
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}
