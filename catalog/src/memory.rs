//! Docker's memory-size syntax (`512m`, `2g`), as `docker run --memory` takes it.

/// The pattern the CRD schema enforces for a memory limit; [`parse`] accepts exactly these.
pub const PATTERN: &str = "^[0-9]+(\\.[0-9]+)?[bkmgtpBKMGTP]?$";

/// What is allowed, in words, for error messages.
pub const ALLOWED: &str =
    "a number with an optional unit b, k, m, g, t or p in Docker's syntax (for example 512m or 2g)";

/// Parses a memory size in Docker's syntax into bytes, or `None` when it is not one.
pub fn parse(text: &str) -> Option<u64> {
    let (number, unit) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&text[..i], c.to_ascii_lowercase()),
        Some(_) => (text, 'b'),
        None => return None,
    };
    let shift = match unit {
        'b' => 0,
        'k' => 10,
        'm' => 20,
        'g' => 30,
        't' => 40,
        'p' => 50,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (number.contains('.') && !digits(fraction)) {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let bytes = value * (1u64 << shift) as f64;
    (bytes.is_finite() && bytes < u64::MAX as f64 && bytes >= 1.0).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn docker_sizes() {
        assert_eq!(parse("2g"), Some(2 << 30));
        assert_eq!(parse("2G"), Some(2 << 30));
        assert_eq!(parse("512m"), Some(512 << 20));
        assert_eq!(parse("1.5g"), Some(3 << 29));
        assert_eq!(parse("1048576"), Some(1 << 20));
        assert_eq!(parse("64k"), Some(64 << 10));
    }

    #[test]
    fn refuses_other_forms() {
        for bad in ["", "g", "2gb", "2 g", "2Gi", "-1g", "1.g", ".5g", "2x", "0"] {
            assert_eq!(parse(bad), None, "{bad:?} must be refused");
        }
    }
}
