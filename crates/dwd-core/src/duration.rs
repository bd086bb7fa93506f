//! Go/Kubernetes duration syntax.
//!
//! The reference implementation reads its configuration through `metav1.Duration`, which uses Go's
//! `time.ParseDuration` grammar (`10s`, `1m30s`, `1.5h`, `300µs`). Operators' existing config files
//! must load unchanged (the drop-in rule), so we accept exactly that grammar, including Go's
//! limits (an `int64` of nanoseconds) and its float arithmetic for fractions. Negative values parse
//! ([`parse_go_duration_nanos`]); [`parse_go_duration`] refuses them for callers where a negative
//! value can't mean anything. Formatting follows
//! Go's `Duration.String()` so log lines and `explain` output read like the reference's.

use std::time::Duration;

use thiserror::Error;

/// Why a duration string was rejected. Every variant carries the offending input so a message
/// reads on its own in a list of configuration problems.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DurationError {
    /// The string is empty (Go's `time.ParseDuration` refuses `""` too).
    #[error("empty duration (expected something like \"30s\")")]
    Empty,
    #[error(
        "invalid duration {input:?}: expected a number followed by a unit (ns, us, µs, ms, s, m, h), e.g. \"1m30s\""
    )]
    /// Not a sequence of `<number><unit>` pieces: a sign alone, a letter where a number must
    /// start, or a lone `.` without digits.
    Syntax {
        /// The rejected string, as given.
        input: String,
    },
    #[error(
        "invalid duration {input:?}: missing unit after a number (use ns, us, µs, ms, s, m or h)"
    )]
    /// A number other than a bare `0` without a unit, e.g. `30`.
    MissingUnit {
        /// The rejected string, as given.
        input: String,
    },
    #[error("invalid duration {input:?}: unknown unit {unit:?} (use ns, us, µs, ms, s, m or h)")]
    /// A number followed by something other than `ns`, `us`, `µs`, `ms`, `s`, `m` or `h`.
    UnknownUnit {
        /// The rejected string, as given.
        input: String,
        /// The unit as written, e.g. `d` in `1d`.
        unit: String,
    },
    #[error("invalid duration {input:?}: negative durations are not allowed")]
    /// A negative non-zero value where only non-negative ones are meaningful
    /// ([`parse_go_duration`] only; [`parse_go_duration_nanos`] accepts them).
    Negative {
        /// The rejected string, as given.
        input: String,
    },
    #[error("invalid duration {input:?}: too large (at most about 2562047h)")]
    /// The value does not fit Go's `int64` nanoseconds (about 292 years, 2562047h).
    Overflow {
        /// The rejected string, as given.
        input: String,
    },
}

const NANOS_PER_MICRO: u64 = 1_000;
const NANOS_PER_MILLI: u64 = 1_000_000;
const NANOS_PER_SEC: u64 = 1_000_000_000;

fn unit_nanos(unit: &str) -> Option<u64> {
    match unit {
        "ns" => Some(1),
        // Go accepts ASCII "us", MICRO SIGN (U+00B5) and GREEK SMALL LETTER MU (U+03BC).
        "us" | "\u{b5}s" | "\u{3bc}s" => Some(NANOS_PER_MICRO),
        "ms" => Some(NANOS_PER_MILLI),
        "s" => Some(NANOS_PER_SEC),
        "m" => Some(60 * NANOS_PER_SEC),
        "h" => Some(3600 * NANOS_PER_SEC),
        _ => None,
    }
}

/// Parses a duration in Go's `time.ParseDuration` grammar: an optional sign, then one or more
/// `<decimal number><unit>` pieces, or the bare string `"0"`. Negative non-zero values are rejected
/// (use [`parse_go_duration_nanos`] where a negative value has a meaning).
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let nanos = parse_go_duration_nanos(s)?;
    match u64::try_from(nanos) {
        Ok(n) => Ok(Duration::from_nanos(n)),
        Err(_) => Err(DurationError::Negative {
            input: s.to_owned(),
        }),
    }
}

/// The largest magnitude of a Go duration, in nanoseconds (`1 << 63`).
const LIMIT: u64 = 1 << 63;

/// Go's `leadingInt`: the digits at the start of `s` as a number, whether there were any, and
/// the rest; `None` once the number passes `1 << 63`.
fn leading_int(s: &str) -> Option<(u64, bool, &str)> {
    let len = s.bytes().take_while(u8::is_ascii_digit).count();
    let (digits, rest) = s.split_at(len);
    let mut whole: u64 = 0;
    for d in digits.bytes() {
        if whole > LIMIT / 10 {
            return None;
        }
        whole = whole * 10 + u64::from(d - b'0');
        if whole > LIMIT {
            return None;
        }
    }
    Some((whole, !digits.is_empty(), rest))
}

/// Go's `leadingFraction` of `s` (after the dot): `(fraction, scale, whether there were
/// digits)` and the rest; digits that no longer fit are skipped, not an error.
fn leading_fraction(s: &str) -> ((u64, f64, bool), &str) {
    let len = s.bytes().take_while(u8::is_ascii_digit).count();
    let (digits, rest) = s.split_at(len);
    let (mut frac, mut scale) = (0u64, 1.0f64);
    let mut skipping = false;
    for d in digits.bytes() {
        if skipping || frac > (LIMIT - 1) / 10 {
            skipping = true;
            continue;
        }
        let next = frac * 10 + u64::from(d - b'0');
        if next > LIMIT {
            skipping = true;
            continue;
        }
        frac = next;
        scale *= 10.0;
    }
    ((frac, scale, !digits.is_empty()), rest)
}

/// Parses a duration exactly as Go's `time.ParseDuration` does, negative values included, into
/// Go's `time.Duration` (signed nanoseconds). The reference's config fields are
/// `metav1.Duration`s, which accept whatever `ParseDuration` accepts; the caller decides what a
/// negative value means.
pub fn parse_go_duration_nanos(s: &str) -> Result<i64, DurationError> {
    let input = s;
    let syntax = || DurationError::Syntax {
        input: input.to_owned(),
    };
    let overflow = || DurationError::Overflow {
        input: input.to_owned(),
    };
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let (negative, mut rest) = if let Some(r) = s.strip_prefix('-') {
        (true, r)
    } else {
        (false, s.strip_prefix('+').unwrap_or(s))
    };
    // Go special-cases a bare zero: it is the only number allowed without a unit.
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(syntax());
    }

    let mut total: u64 = 0;
    while !rest.is_empty() {
        if !rest.starts_with(|c: char| c == '.' || c.is_ascii_digit()) {
            return Err(syntax());
        }
        // Integer part (Go's leadingInt: an error once it passes 1<<63).
        let (whole, int_digits, after_int) = leading_int(rest).ok_or_else(overflow)?;
        rest = after_int;
        // Fraction (Go's leadingFraction: digits that no longer fit are skipped, not an error).
        let (frac, scale, has_frac) = match rest.strip_prefix('.') {
            Some(after_dot) => {
                let (fraction, after_frac) = leading_fraction(after_dot);
                rest = after_frac;
                fraction
            }
            None => (0, 1.0, false),
        };
        if !int_digits && !has_frac {
            return Err(syntax());
        }
        // Unit: everything up to the next digit or dot.
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(rest.len(), |(i, _)| i);
        let (unit, after_unit) = rest.split_at(unit_len);
        rest = after_unit;
        if unit.is_empty() {
            return Err(DurationError::MissingUnit {
                input: input.to_owned(),
            });
        }
        let per_unit = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
            input: input.to_owned(),
            unit: unit.to_owned(),
        })?;
        if whole > LIMIT / per_unit {
            return Err(overflow());
        }
        let mut piece = whole * per_unit;
        if frac > 0 {
            // Go computes the fraction in float64 and truncates; doing the same keeps every
            // value bit-identical to the reference's.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let extra = (frac as f64 * (per_unit as f64 / scale)) as u64;
            piece = piece.checked_add(extra).ok_or_else(overflow)?;
            if piece > LIMIT {
                return Err(overflow());
            }
        }
        total = total.checked_add(piece).ok_or_else(overflow)?;
        if total > LIMIT {
            return Err(overflow());
        }
    }
    if negative {
        // `total <= 1<<63` here, and -(1<<63) is i64::MIN.
        Ok(0i64.wrapping_sub_unsigned(total))
    } else {
        i64::try_from(total).map_err(|_| overflow())
    }
}

/// Writes `value / 10^precision` with the fraction's trailing zeros dropped, like Go's `fmtFrac`
/// followed by `fmtInt`.
fn push_fraction(out: &mut String, value: u128, precision: u32) {
    let divisor = 10u128.pow(precision);
    let int_part = value / divisor;
    let frac_part = value % divisor;
    out.push_str(&int_part.to_string());
    if frac_part != 0 {
        let digits = format!("{frac_part:0width$}", width = precision as usize);
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
}

/// Formats a duration like Go's `Duration.String()`: `0s`, `500ms`, `1.5µs`, `10s`, `5m0s`,
/// `1h0m0s`, `2h45m0.5s`.
pub fn format_go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    let mut out = String::new();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < u128::from(NANOS_PER_SEC) {
        if nanos < u128::from(NANOS_PER_MICRO) {
            out.push_str(&nanos.to_string());
            out.push_str("ns");
        } else if nanos < u128::from(NANOS_PER_MILLI) {
            push_fraction(&mut out, nanos, 3);
            out.push_str("\u{b5}s");
        } else {
            push_fraction(&mut out, nanos, 6);
            out.push_str("ms");
        }
        return out;
    }
    let secs = nanos / u128::from(NANOS_PER_SEC);
    let sub = nanos % u128::from(NANOS_PER_SEC);
    let hours = secs / 3600;
    let minutes = (secs / 60) % 60;
    if hours > 0 {
        out.push_str(&hours.to_string());
        out.push('h');
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&minutes.to_string());
        out.push('m');
    }
    push_fraction(&mut out, (secs % 60) * u128::from(NANOS_PER_SEC) + sub, 9);
    out.push('s');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Duration {
        parse_go_duration(s).unwrap()
    }

    #[test]
    fn parses_simple_units() {
        assert_eq!(ok("10s"), Duration::from_secs(10));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("300us"), Duration::from_micros(300));
        assert_eq!(ok("300µs"), Duration::from_micros(300));
        assert_eq!(ok("300μs"), Duration::from_micros(300));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("3h"), Duration::from_secs(3 * 3600));
    }

    #[test]
    fn parses_compound_and_fractional_values() {
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok("1h2m3.5s"), Duration::from_millis(3_723_500));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1.s"), Duration::from_secs(1));
        assert_eq!(ok("+5s"), Duration::from_secs(5));
        assert_eq!(ok("0.000000001s"), Duration::from_nanos(1));
    }

    #[test]
    fn zero_forms_are_accepted() {
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("-0s"), Duration::ZERO);
        assert_eq!(ok("+0"), Duration::ZERO);
    }

    #[test]
    fn signed_parsing_matches_go_parse_duration() {
        let ns = |s: &str| parse_go_duration_nanos(s).unwrap();
        assert_eq!(ns("-5s"), -5_000_000_000);
        assert_eq!(ns("-1h2m"), -3_720_000_000_000);
        assert_eq!(ns("-0"), 0);
        assert_eq!(ns("-9223372036854775808ns"), i64::MIN);
        assert_eq!(ns("9223372036854775807ns"), i64::MAX);
        assert!(parse_go_duration_nanos("9223372036854775808ns").is_err());
        assert_eq!(ns(".5h"), 1_800_000_000_000);
        assert_eq!(ns("1.5µs"), 1500);
        // Go truncates the fraction's nanoseconds.
        assert_eq!(ns("0.9ns"), 0);
        assert_eq!(ns("1.0000000009s"), 1_000_000_000);
        // Go's float arithmetic for fractions (values checked against Go 1.26).
        assert_eq!(ns("0.3333333333333333333h"), 1_200_000_000_000);
        assert_eq!(ns("1.1h"), 3_960_000_000_000);
        assert_eq!(ns("2562047h47m16.854775807s"), i64::MAX);
        assert!(parse_go_duration_nanos("2562047h47m16.854775808s").is_err());
        // Fraction digits past what fits are skipped, not an error.
        assert_eq!(ns("1.00000000000000000000000000001s"), 1_000_000_000);
        for bad in ["", "-", "+", "1", "1d", "1.", ".", "s", "1s-1s", "- 1s"] {
            assert!(parse_go_duration_nanos(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn negative_durations_are_rejected() {
        assert!(matches!(
            parse_go_duration("-1s"),
            Err(DurationError::Negative { .. })
        ));
    }

    #[test]
    fn malformed_durations_are_rejected_with_the_input_named() {
        assert_eq!(parse_go_duration(""), Err(DurationError::Empty));
        assert!(matches!(
            parse_go_duration("10"),
            Err(DurationError::MissingUnit { .. })
        ));
        let err = parse_go_duration("10x").unwrap_err();
        assert!(matches!(err, DurationError::UnknownUnit { ref unit, .. } if unit == "x"));
        assert!(err.to_string().contains("\"10x\""));
        for bad in ["s", ".s", "-", "1s 2s", "1e3s", " 1s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn values_beyond_go_int64_overflow() {
        assert!(matches!(
            parse_go_duration("2562048h"),
            Err(DurationError::Overflow { .. })
        ));
        assert!(parse_go_duration("2562047h").is_ok());
        assert!(matches!(
            parse_go_duration("99999999999999999999999s"),
            Err(DurationError::Overflow { .. })
        ));
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
        assert_eq!(format_go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(format_go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(format_go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_go_duration(Duration::from_nanos(1500)), "1.5µs");
        assert_eq!(format_go_duration(Duration::from_nanos(7)), "7ns");
        assert_eq!(format_go_duration(Duration::from_micros(2500)), "2.5ms");
        assert_eq!(
            format_go_duration(Duration::from_millis(9_900_500)),
            "2h45m0.5s"
        );
    }

    #[test]
    fn format_then_parse_round_trips() {
        for d in [
            Duration::from_secs(40),
            Duration::from_millis(1234),
            Duration::from_nanos(123_456_789_012),
        ] {
            assert_eq!(ok(&format_go_duration(d)), d);
        }
    }
}
