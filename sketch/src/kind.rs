//! The kind of a sketch: which question it answers, and the byte at offset 5 of every
//! frame ([`crate::format`]). Errors name kinds, frames carry them; this module needs
//! neither.

/// Which question a sketch answers; the byte at offset 5 of every frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// HyperLogLog or UltraLogLog: how many distinct items?
    Distinct = 1,
    /// Count-Min and frequent items: how often? what are the top K?
    Frequency = 2,
    /// Bloom filter: was this item seen?
    Membership = 3,
}

impl Kind {
    /// All kinds, in code order.
    pub const ALL: [Kind; 3] = [Kind::Distinct, Kind::Frequency, Kind::Membership];

    /// The kind's code in the frame header.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The kind for a header code, if one is defined.
    pub fn from_code(code: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// The kind's name as users write it (`distinct`, `frequency`, `membership`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Distinct => "distinct",
            Kind::Frequency => "frequency",
            Kind::Membership => "membership",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!("unknown sketch kind {s:?} (expected distinct, frequency or membership)")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_parse() {
        for kind in Kind::ALL {
            assert_eq!(kind.name().parse::<Kind>().unwrap(), kind);
        }
        assert!("hll".parse::<Kind>().is_err());
    }
}
