//! Membership over a range: was item X seen in any of these filters, and in which?
//!
//! A metric keeps one [`Bloom`] filter per series and hour, and a question spans a range:
//! the filters of `N` server-hours. Merging them (bitwise OR) makes one filter of the
//! union of all their items, which a filter sized for one server-hour cannot hold: the
//! demo's week, 6 servers × 168 hours of filters of capacity 20,000 at 1%, merges into one
//! whose false-positive rate is 98.4%, so every "nobody" comes back "maybe". This module
//! answers a range without merging: it looks the item up in each stored filter and
//! combines the answers, and it sizes the filters for the range a metric's queries span.
//!
//! # Sizing for the question
//!
//! [`RangeSizing::for_range`] takes the number of filters `N` a lookup consults (servers ×
//! hours), the distinct items `n` one filter is expected to hold, and the false-positive
//! probability `P` wanted for a whole range lookup: the chance that an item absent from
//! every filter gets a [`RangeAnswer::Seen`]. That happens when at least one filter gives
//! a false positive. With each filter's rate at most `f` and the filters' false positives
//! independent (next section),
//!
//! ```text
//! P(Seen | absent) = 1 − (1 − f)^N ≤ P   ⟺   f ≤ 1 − (1 − P)^(1/N)
//! ```
//!
//! computed as `−expm1(ln_1p(−P)/N)` so that it stays exact when `f` is tiny. For small
//! `P`, `f ≈ P/N`: 5% over 1,008 filters asks each for 5.09·10⁻⁵, about 20.6 bits per item
//! and 14 hashes (a 1% filter takes 9.6 bits per item). The filter [`Bloom::new`] builds
//! rounds its bits up to a word and its hash count to an integer; the sizing computes
//! the rate of the filter actually built at capacity, `(1 − e^(−k·n/m))^k`, and lowers
//! the rate it asks for until that is at most `f`, so [`RangeSizing::range_fpr_at_capacity`]
//! is at most `P`. The promise holds at capacity: fewer items make it better, more make
//! it worse, which is why lookups use each filter's measured rate, not its design point.
//!
//! # Looking up a range
//!
//! [`lookup`] consults every filter of the range for one item (hashed once) and
//! [`combine`] does the same from answers computed elsewhere ([`FilterAnswer`]: whether
//! the filter says "maybe", and its false-positive rate `f_i` from its fill,
//! [`Bloom::estimated_fpr`]). A lookup reads `k` bits or fewer of each filter, and the
//! bit arrays of the filters that say "maybe" once more. The result is:
//!
//! - [`RangeAnswer::DefinitelyAbsent`] when no filter says "maybe": certain, since a
//!   Bloom filter has no false negatives (the probability that a present item is missed
//!   is 0);
//! - [`RangeAnswer::Seen`] otherwise, with the positions of the filters that said
//!   "maybe" and three figures, each the probability of something *if the item was
//!   absent*:
//!   - `range_fpr = 1 − Π(1 − f_i)` over every consulted filter: the chance that an
//!     absent item gets a `Seen` answer over this range at all — what "was it seen?"
//!     should quote;
//!   - `all_false_probability`: the chance that every one of these positions says
//!     "maybe" — what "where was it seen?" should quote;
//!   - `position_fprs`: `f_i` of each position, for "was it seen there?".
//!
//!   None of these is the probability that the item was absent given the answer: that
//!   needs a prior (how likely the item is to be anywhere) which no sketch holds.
//!   `all_false_probability ≤ P(at least as many positives | absent) ≤ P(at least one)
//!   ≈ range_fpr`, so the two bracket the evidence that the item was seen at all.
//!
//! # Are the filters' false positives independent?
//!
//! Not exactly, and it matters for one of the figures. Over a random absent item `x`, a
//! filter with a fraction `fill` of its `m` bits set says "maybe" when all `k` positions
//! of `x` are set: probability `fill^k = f_i` (positions are as good as independent and
//! uniform, [`crate::hash`]). Filters of the same size put `x` at the same positions, so
//! two of them both say "maybe" when the positions fall in the bits set in *both*:
//! probability `(|S_i ∩ S_j|/m)^k`. That is `f_i·f_j` when the set bits overlap as chance
//! predicts, `|S_i ∩ S_j|/m = fill_i·fill_j`, which holds for filters of different items.
//! But filters of the same metric share items (the regular users come every hour, to
//! every server), and a shared item sets the same bits in both: their bits overlap more
//! than chance, and their false positives come together, on the same absent items.
//!
//! - `range_fpr` multiplies as if independent. Clustered false positives reach *fewer*
//!   absent items than independent ones of the same rates, so it errs on the side of
//!   "maybe": in the demo's week the share of absent items answered `Seen` measured
//!   0.967 ± 0.020 of it at 5% and 0.956 ± 0.047 at 1% (docs/ACCURACY.md). The expected number of
//!   positives, `Σ f_i`, is exact either way.
//! - The chance that several positives are *all* false is larger than `Π f_i`, by the
//!   overlap ratio to the power `k` per pair — large for `k` of 14 or more. [`lookup`]
//!   therefore computes `all_false_probability` from the bits: for filters of the same
//!   size, sorted by hash count `k_1 ≥ k_2 ≥ …` (a filter with fewer hashes uses a prefix
//!   of the same positions), it is `Π_j (|S_1 ∩ … ∩ S_j|/m)^(k_j − k_(j+1))`; filters of
//!   different sizes are multiplied as independent ([`all_maybe_probability`]). In the
//!   demo's week a pair of filters both say "maybe" 5 to 7 times as often as the
//!   product predicts. [`combine`], which sees only the answers, multiplies, and says
//!   so (`all_false_exact` is false).
//!
//! # Saturated filters
//!
//! A filter past its design point answers "maybe" to much, and a saturated one to
//! everything; its `f_i` says so, and so does the answer: `saturated` lists the positions
//! whose `f_i` is at least [`SATURATED_FPR`], and [`RangeAnswer::is_noise`] is true when
//! the positives are at least as likely to be all false as not. A "no" from any filter
//! stays certain, however full the others are.
//!
//! ```
//! use hourglass_sketch::bloom::Bloom;
//! use hourglass_sketch::membership::{lookup, RangeAnswer, RangeSizing};
//!
//! // A week of hourly filters on 2 servers; lookups over the week wrong at most 5% of the
//! // time for an item seen nowhere.
//! let sizing = RangeSizing::for_range(2 * 168, 1_000, 0.05)?;
//! assert!(sizing.range_fpr_at_capacity <= 0.05);
//! let mut filters: Vec<Bloom> = (0..2 * 168).map(|_| sizing.new_filter()).collect::<Result<_, _>>()?;
//! filters[40].insert(b"user42");
//! filters[300].insert(b"user42");
//!
//! match lookup(&filters, b"user42") {
//!     RangeAnswer::Seen { where_, all_false_probability, .. } => {
//!         assert_eq!(where_, vec![40, 300]);
//!         assert!(all_false_probability < 1e-9); // one item in 18,000 bits: no doubt
//!     }
//!     other => panic!("a present item is always found, got {other:?}"),
//! }
//! assert!(lookup(&filters, b"nobody").is_definitely_absent());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Borrow;

use crate::bloom::{self, Bloom};
use crate::error::ParameterError;
use crate::hash::item_hash;

/// A filter whose false-positive rate is at least this says "maybe" to at least half the
/// items it never saw: its "maybe" is flagged as carrying next to no information.
pub const SATURATED_FPR: f64 = 0.5;

/// The per-filter false-positive rate `f` that makes a lookup over `filters` filters wrong
/// with probability at most `range_fpr` for an item absent from all of them, were the
/// filters' false positives independent: `1 − (1 − range_fpr)^(1/filters)`.
///
/// The inverse of [`range_fpr_of`]. Out-of-range inputs give NaN or a value outside
/// `(0, 1)`; [`RangeSizing::for_range`] validates them.
pub fn filter_fpr_for(range_fpr: f64, filters: u64) -> f64 {
    -(f64::ln_1p(-range_fpr) / filters as f64).exp_m1()
}

/// The chance that at least one of `filters` independent filters, each with false-positive
/// rate `filter_fpr`, says "maybe" for an item none of them holds: `1 − (1 − f)^N`.
pub fn range_fpr_of(filter_fpr: f64, filters: u64) -> f64 {
    -(filters as f64 * f64::ln_1p(-filter_fpr)).exp_m1()
}

/// The expected false-positive rate of a filter of `bits` bits and `hashes` hashes once it
/// holds `items` distinct items: `(1 − e^(−k·n/m))^k`, the expected fill to the power `k`.
pub fn expected_fpr(bits: u64, hashes: u32, items: f64) -> f64 {
    let k = f64::from(hashes);
    (-(-k * items / bits as f64).exp_m1()).powf(k)
}

/// Per-filter Bloom parameters for a metric whose lookups span a range of filters, from
/// [`RangeSizing::for_range`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RangeSizing {
    /// Filters one lookup consults (servers × hours), as asked.
    pub filters: u64,
    /// Expected distinct items per filter, as asked: the capacity.
    pub items_per_filter: u64,
    /// The false-positive probability wanted for a whole range lookup, as asked.
    pub range_fpr: f64,
    /// Capacity to pass to [`Bloom::new`] (equal to `items_per_filter`).
    pub capacity: u64,
    /// Target false-positive rate to pass to [`Bloom::new`]: at most
    /// [`filter_fpr_for`]`(range_fpr, filters)`, lowered where the filter's rounding
    /// would otherwise overshoot it.
    pub fpr: f64,
    /// Bits per filter (`m`).
    pub bits: u64,
    /// Hashes per item (`k`).
    pub hashes: u32,
    /// Bytes of bit array per filter.
    pub bytes: u64,
    /// The filter's expected false-positive rate when it holds `capacity` items,
    /// [`expected_fpr`]`(bits, hashes, capacity)`.
    pub fpr_at_capacity: f64,
    /// The range lookup's false-positive probability when every filter is at capacity,
    /// [`range_fpr_of`]`(fpr_at_capacity, filters)`: at most `range_fpr`.
    pub range_fpr_at_capacity: f64,
}

impl RangeSizing {
    /// Sizes the filters of a metric whose lookups consult `filters` filters, each holding
    /// about `items_per_filter` distinct items, so that a lookup of an item absent from all
    /// of them says [`RangeAnswer::Seen`] with probability at most `range_fpr` (module
    /// docs for the derivation).
    ///
    /// Errors name the parameter: `filters` and `items per filter` must be at least 1,
    /// `range false-positive rate` strictly between 0 and 1 and large enough that each
    /// filter's share is a positive number, and the filter must fit [`bloom::MAX_BITS`].
    pub fn for_range(
        filters: u64,
        items_per_filter: u64,
        range_fpr: f64,
    ) -> Result<RangeSizing, ParameterError> {
        if filters == 0 {
            return Err(ParameterError::new(
                "filters",
                filters,
                "must be at least 1 (the filters one lookup consults, e.g. servers × hours)",
            ));
        }
        if items_per_filter == 0 {
            return Err(ParameterError::new(
                "items per filter",
                items_per_filter,
                "must be at least 1",
            ));
        }
        if !(range_fpr > 0.0 && range_fpr < 1.0) {
            return Err(ParameterError::new(
                "range false-positive rate",
                range_fpr,
                "must be strictly between 0 and 1",
            ));
        }
        let wanted = filter_fpr_for(range_fpr, filters);
        if !(wanted.is_normal() && wanted < 1.0) {
            return Err(ParameterError::new(
                "range false-positive rate",
                range_fpr,
                format!(
                    "over {filters} filters leaves each a rate of {wanted:e}, which a filter cannot be sized for"
                ),
            ));
        }
        // Bloom::new rounds bits up to a word (a lower rate) and the hash count to an
        // integer (a slightly higher one): ask for less until the filter built meets it.
        let mut asked = wanted;
        for _ in 0..64 {
            if !asked.is_normal() {
                break;
            }
            let (bits, hashes) = bloom::design(items_per_filter, asked)?;
            let fpr_at_capacity = expected_fpr(bits, hashes, items_per_filter as f64);
            if fpr_at_capacity <= wanted {
                return Ok(RangeSizing {
                    filters,
                    items_per_filter,
                    range_fpr,
                    capacity: items_per_filter,
                    fpr: asked,
                    bits,
                    hashes,
                    bytes: bits / 8,
                    fpr_at_capacity,
                    range_fpr_at_capacity: range_fpr_of(fpr_at_capacity, filters),
                });
            }
            asked *= (wanted / fpr_at_capacity).min(0.999);
        }
        Err(ParameterError::new(
            "range false-positive rate",
            range_fpr,
            format!("no filter for {items_per_filter} items meets {wanted:e} per filter"),
        ))
    }

    /// An empty filter of this size: `Bloom::new(capacity, fpr)`.
    pub fn new_filter(&self) -> Result<Bloom, ParameterError> {
        Bloom::new(self.capacity, self.fpr)
    }
}

/// One consulted filter's answer for an item, as [`combine`] takes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FilterAnswer {
    /// Whether the filter says the item may have been inserted.
    pub maybe_present: bool,
    /// The filter's false-positive rate from its fill, [`Bloom::estimated_fpr`]: the
    /// probability that it says "maybe" for an item it does not hold.
    pub fpr: f64,
}

impl FilterAnswer {
    /// The answer of `filter` for `item`.
    pub fn of(filter: &Bloom, item: &[u8]) -> FilterAnswer {
        FilterAnswer::of_hash(filter, item_hash(item))
    }

    /// The answer of `filter` for an item's [`item_hash`].
    pub fn of_hash(filter: &Bloom, hash: u64) -> FilterAnswer {
        FilterAnswer {
            maybe_present: filter.contains_hash(hash),
            fpr: filter.estimated_fpr(),
        }
    }
}

/// The answer of a range lookup ([`lookup`], [`combine`]). Positions are indices into the
/// filters consulted, in the order given; the caller maps them to servers and hours.
#[derive(Debug, Clone, PartialEq)]
pub enum RangeAnswer {
    /// No filter says "maybe": the item was inserted into none of them. Certain.
    DefinitelyAbsent {
        /// Filters consulted. Zero means there was nothing to look in, which the caller
        /// should report as "no data" rather than as an absence.
        consulted: usize,
        /// The probability that an item present in the range gets this answer: 0, since
        /// a Bloom filter has no false negatives. Here so that the answer states it.
        miss_probability: f64,
        /// What a "seen" would have meant: the probability that an absent item gets
        /// one over these filters, `1 − Π(1 − f_i)`.
        range_fpr: f64,
    },
    /// At least one filter says "maybe".
    Seen {
        /// Filters consulted.
        consulted: usize,
        /// Positions of the filters that say "maybe", ascending.
        where_: Vec<usize>,
        /// The false-positive rate `f_i` of each position in `where_`, in the same order:
        /// the probability that that filter says "maybe" for an item it does not hold.
        position_fprs: Vec<f64>,
        /// The probability that an item absent from every consulted filter gets a
        /// `Seen` answer over them, `1 − Π(1 − f_i)` (conservative when filters share
        /// items: module docs).
        range_fpr: f64,
        /// The probability, were the item absent from every filter in `where_`, that all
        /// of them say "maybe" (0 once below the smallest `f64`).
        all_false_probability: f64,
        /// Whether `all_false_probability` was computed from the filters' bits (exact
        /// for filters of one size, [`lookup`]) rather than multiplied as if the
        /// filters were independent ([`combine`]; an underestimate when they share items).
        all_false_exact: bool,
        /// Positions in `where_` whose filter's `f_i` is at least [`SATURATED_FPR`]: their
        /// "maybe" carries next to no information.
        saturated: Vec<usize>,
    },
}

impl RangeAnswer {
    /// Whether no consulted filter says "maybe".
    pub fn is_definitely_absent(&self) -> bool {
        matches!(self, RangeAnswer::DefinitelyAbsent { .. })
    }

    /// Filters consulted.
    pub fn consulted(&self) -> usize {
        match self {
            RangeAnswer::DefinitelyAbsent { consulted, .. }
            | RangeAnswer::Seen { consulted, .. } => *consulted,
        }
    }

    /// The probability that an item absent from every consulted filter gets a `Seen`
    /// answer over them.
    pub fn range_fpr(&self) -> f64 {
        match self {
            RangeAnswer::DefinitelyAbsent { range_fpr, .. }
            | RangeAnswer::Seen { range_fpr, .. } => *range_fpr,
        }
    }

    /// Whether a `Seen` answer is no evidence: its positives are at least as likely to
    /// be all false as not (`all_false_probability ≥` [`SATURATED_FPR`]), as when the only
    /// "maybe" comes from a saturated filter. Never true of `DefinitelyAbsent`.
    pub fn is_noise(&self) -> bool {
        match self {
            RangeAnswer::DefinitelyAbsent { .. } => false,
            RangeAnswer::Seen {
                all_false_probability,
                ..
            } => *all_false_probability >= SATURATED_FPR,
        }
    }
}

impl std::fmt::Display for RangeAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RangeAnswer::DefinitelyAbsent { consulted: 0, .. } => {
                f.write_str("no data: no filter covers the range")
            }
            RangeAnswer::DefinitelyAbsent { consulted, .. } => {
                write!(f, "definitely absent from all {consulted} filters")
            }
            RangeAnswer::Seen {
                consulted,
                where_,
                range_fpr,
                all_false_probability,
                saturated,
                ..
            } => {
                write!(
                    f,
                    "maybe: in {} of {consulted} filters; an absent item would be seen somewhere in this range with probability {}, and in all of these with probability {}",
                    where_.len(),
                    probability(*range_fpr),
                    probability(*all_false_probability)
                )?;
                if self.is_noise() {
                    f.write_str("; this answer is no evidence that the item was seen")?;
                }
                if !saturated.is_empty() {
                    write!(
                        f,
                        "; {} of these filters are so full that they say \"maybe\" to at least half of all items",
                        saturated.len()
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// A probability as people read it: a percentage down to 0.01%, scientific below.
fn probability(p: f64) -> String {
    if p == 0.0 || p >= 1e-4 {
        format!("{:.2}%", p * 100.0)
    } else {
        format!("{p:.1e}")
    }
}

/// The probability that an absent item gets at least one "maybe" from filters of these
/// rates, `1 − Π(1 − f_i)`, summed in logs so that a thousand tiny rates keep their
/// precision.
fn any_positive(fprs: impl IntoIterator<Item = f64>) -> f64 {
    -fprs
        .into_iter()
        .map(|f| f64::ln_1p(-f))
        .sum::<f64>()
        .exp_m1()
}

/// The answer from the positions that said "maybe", with `all_false` computing the
/// probability that all of them would for an absent item.
fn answer(
    consulted: usize,
    fprs: &[f64],
    where_: Vec<usize>,
    all_false: impl FnOnce(&[usize]) -> f64,
    all_false_exact: bool,
) -> RangeAnswer {
    let range_fpr = any_positive(fprs.iter().copied());
    if where_.is_empty() {
        return RangeAnswer::DefinitelyAbsent {
            consulted,
            miss_probability: 0.0,
            range_fpr,
        };
    }
    let position_fprs: Vec<f64> = where_.iter().map(|&i| fprs[i]).collect();
    let saturated = where_
        .iter()
        .copied()
        .filter(|&i| fprs[i] >= SATURATED_FPR)
        .collect();
    RangeAnswer::Seen {
        consulted,
        all_false_probability: all_false(&where_),
        where_,
        position_fprs,
        range_fpr,
        all_false_exact,
        saturated,
    }
}

/// Looks `item` up in every filter of a range, hashing it once, and combines the answers
/// (module docs). `all_false_probability` is computed from the bits of the filters that
/// say "maybe", so it accounts for items the filters share.
pub fn lookup<B: Borrow<Bloom>>(filters: &[B], item: &[u8]) -> RangeAnswer {
    lookup_hash(filters, item_hash(item))
}

/// [`lookup`] for an item's [`item_hash`].
pub fn lookup_hash<B: Borrow<Bloom>>(filters: &[B], hash: u64) -> RangeAnswer {
    let filters: Vec<&Bloom> = filters.iter().map(Borrow::borrow).collect();
    let fprs: Vec<f64> = filters.iter().map(|f| f.estimated_fpr()).collect();
    let where_: Vec<usize> = filters
        .iter()
        .enumerate()
        .filter(|(_, f)| f.contains_hash(hash))
        .map(|(i, _)| i)
        .collect();
    answer(
        filters.len(),
        &fprs,
        where_,
        |positives| {
            let positive: Vec<&Bloom> = positives.iter().map(|&i| filters[i]).collect();
            all_maybe_probability(&positive)
        },
        true,
    )
}

/// Combines answers computed elsewhere, one per consulted filter in range order.
/// `all_false_probability` is `Π f_i` over the positives, as if the filters were
/// independent (an underestimate when they share items; [`lookup`] is exact).
///
/// An error names the first answer whose rate is not a probability (NaN or outside
/// `[0, 1]`).
pub fn combine(answers: &[FilterAnswer]) -> Result<RangeAnswer, ParameterError> {
    if let Some((i, a)) = answers
        .iter()
        .enumerate()
        .find(|(_, a)| !(0.0..=1.0).contains(&a.fpr))
    {
        return Err(ParameterError::new(
            "filter false-positive rate",
            a.fpr,
            format!("of filter {i} must be between 0 and 1"),
        ));
    }
    let fprs: Vec<f64> = answers.iter().map(|a| a.fpr).collect();
    let where_ = answers
        .iter()
        .enumerate()
        .filter(|(_, a)| a.maybe_present)
        .map(|(i, _)| i)
        .collect();
    Ok(answer(
        answers.len(),
        &fprs,
        where_,
        |positives| positives.iter().map(|&i| fprs[i]).product(),
        false,
    ))
}

/// The probability that an item none of `filters` holds gets "maybe" from every one of
/// them, over random items, from their bits: exact for filters of one size (the bits set
/// in all of them; module docs). Across sizes it is the smallest size group's figure, an
/// upper bound: an item's positions sit at the same relative place in filters of any
/// size ([`crate::hash`] reduces by multiply-shift), so filters of different sizes that
/// share items say "maybe" to nearly the same absent items, and multiplying their
/// figures as independent understates it 3 to 22 times. For one filter it is
/// [`Bloom::estimated_fpr`]; for none, 1.
pub fn all_maybe_probability<B: Borrow<Bloom>>(filters: &[B]) -> f64 {
    let mut by_size: Vec<&Bloom> = filters.iter().map(Borrow::borrow).collect();
    // Same size together, most hashes first within a size.
    by_size.sort_by_key(|f| (f.bits(), std::cmp::Reverse(f.hashes())));
    by_size
        .chunk_by(|a, b| a.bits() == b.bits())
        .map(same_size_all_set)
        .fold(1.0, f64::min)
}

/// [`all_maybe_probability`] for filters of one size, sorted by hash count descending.
/// Position `i` of an item is the same in each, and used by the filters with more than
/// `i` hashes: positions `k_(j+1)..k_j` must fall in the bits set in the first `j`
/// filters.
fn same_size_all_set(filters: &[&Bloom]) -> f64 {
    let m = filters[0].bits() as f64;
    let mut common: Vec<u64> = filters[0].words().to_vec();
    let mut p = 1.0;
    for (j, filter) in filters.iter().enumerate() {
        for (c, w) in common.iter_mut().zip(filter.words()) {
            *c &= w;
        }
        let next_hashes = filters.get(j + 1).map_or(0, |f| f.hashes());
        let span = filter.hashes() - next_hashes;
        if span > 0 {
            let ones: u64 = common.iter().map(|w| u64::from(w.count_ones())).sum();
            p *= (ones as f64 / m).powi(span as i32);
        }
    }
    p
}

#[cfg(test)]
mod tests;
