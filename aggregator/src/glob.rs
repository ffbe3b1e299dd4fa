//! Shell-style globs for selecting servers by name: `*` any run, `?` any one character,
//! `[abc]`, `[a-z]` and `[!abc]` a set. Everything else matches itself.

/// Whether `name` matches `pattern`. A malformed set (`[` without `]`) matches a literal `[`.
pub fn matches(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    // Iterative matching with one backtrack point for the last `*`: linear in practice and
    // never exponential, whatever the pattern.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() {
            match pattern[p] {
                '*' => {
                    star = Some((p, n));
                    p += 1;
                    continue;
                }
                '?' => {
                    p += 1;
                    n += 1;
                    continue;
                }
                '[' => {
                    if let Some((hit, next)) = match_set(&pattern, p, name[n]) {
                        if hit {
                            p = next;
                            n += 1;
                            continue;
                        }
                    } else if name[n] == '[' {
                        p += 1;
                        n += 1;
                        continue;
                    }
                }
                c if c == name[n] => {
                    p += 1;
                    n += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, sn)) => {
                p = sp + 1;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// Matches `c` against the set starting at `pattern[start] == '['`: whether it matched and
/// where the pattern goes on, or `None` if the set is not closed.
fn match_set(pattern: &[char], start: usize, c: char) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = matches!(pattern.get(i), Some('!') | Some('^'));
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    while i < pattern.len() {
        if pattern[i] == ']' && !first {
            return Some((hit != negate, i + 1));
        }
        first = false;
        if i + 2 < pattern.len() && pattern[i + 1] == '-' && pattern[i + 2] != ']' {
            hit |= pattern[i] <= c && c <= pattern[i + 2];
            i += 3;
        } else {
            hit |= pattern[i] == c;
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_a_shell() {
        let cases = [
            ("web-*", "web-1", true),
            ("web-*", "db-1", false),
            ("*", "", true),
            ("*-eu-*", "web-eu-3", true),
            ("web-?", "web-12", false),
            ("web-??", "web-12", true),
            ("web-[0-4]", "web-3", true),
            ("web-[0-4]", "web-7", false),
            ("web-[!0-4]", "web-7", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("[x", "[x", true),
            ("[]]", "]", true),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(matches(pattern, name), expected, "{pattern} vs {name}");
        }
    }

    #[test]
    fn pathological_patterns_finish() {
        let name = "a".repeat(200);
        assert!(!matches(&format!("{}b", "*a".repeat(50)), &name));
    }
}
