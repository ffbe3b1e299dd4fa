//! How numbers look to a person: thousands separators, sensible precision, and tables
//! of them whose item column fits its names.

/// An integer with thousands separators: `1204331` → `1,204,331`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A non-negative estimate rounded to a whole count, grouped.
pub fn count(x: f64) -> String {
    if x.is_infinite() || x >= f64::MAX {
        // Unbounded (a saturated sketch), as JSON carries it too.
        "∞".to_string()
    } else if x >= 1e15 {
        // Beyond any real count, and beyond what u64 rounds to exactly.
        format!("{x:.3e}")
    } else if x.is_finite() && x >= 0.0 {
        grouped(x.round() as u64)
    } else {
        format!("{x}")
    }
}

/// A fraction as a percentage with enough digits to be useful at its size.
pub fn percent(fraction: f64) -> String {
    let p = fraction * 100.0;
    if p == 0.0 {
        "0%".to_string()
    } else if p >= 10.0 {
        format!("{p:.1}%")
    } else if p >= 0.01 {
        format!("{p:.2}%")
    } else {
        format!("{p:.2e}%")
    }
}

/// The width of a column of item names (as written, quoted) under the heading `item`:
/// the longest name's, in characters, and never narrower than the heading.
pub fn item_width(names: &[String]) -> usize {
    names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(4)
        .max(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(1_204_331), "1,204,331");
        assert_eq!(count(1_184_899.6), "1,184,900");
    }

    #[test]
    fn percentages_keep_their_digits() {
        assert_eq!(percent(0.0081), "0.81%");
        assert_eq!(percent(0.5), "50.0%");
        assert_eq!(percent(0.0), "0%");
        assert_eq!(percent(1e-7), "1.00e-5%");
    }
}
