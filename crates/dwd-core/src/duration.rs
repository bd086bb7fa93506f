//! Go/Kubernetes duration syntax.
//!
//! The reference implementation reads its configuration through `metav1.Duration`, which uses Go's
//! `time.ParseDuration` grammar (`10s`, `1m30s`, `1.5h`, `300µs`). Operators' existing config files
//! must load unchanged (the drop-in rule), so we accept exactly that grammar, restricted to
//! non-negative values because no watchdog setting means anything when negative. Formatting follows
//! Go's `Duration.String()` so log lines and `explain` output read like the reference's.

use std::time::Duration;

use thiserror::Error;

/// Why a duration string was rejected. Every variant carries the offending input so a message
/// reads on its own in a list of configuration problems.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DurationError {
    #[error("empty duration (expected something like \"30s\")")]
    Empty,
    #[error(
        "invalid duration {input:?}: expected a number followed by a unit (ns, us, µs, ms, s, m, h), e.g. \"1m30s\""
    )]
    Syntax { input: String },
    #[error(
        "invalid duration {input:?}: missing unit after a number (use ns, us, µs, ms, s, m or h)"
    )]
    MissingUnit { input: String },
    #[error("invalid duration {input:?}: unknown unit {unit:?} (use ns, us, µs, ms, s, m or h)")]
    UnknownUnit { input: String, unit: String },
    #[error("invalid duration {input:?}: negative durations are not allowed")]
    Negative { input: String },
    #[error("invalid duration {input:?}: too large (at most about 2562047h)")]
    Overflow { input: String },
}

const NANOS_PER_MICRO: u64 = 1_000;
const NANOS_PER_MILLI: u64 = 1_000_000;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Go's `time.Duration` is an `int64` of nanoseconds; anything beyond cannot come from a valid Go
/// config, so we reject it the way Go does instead of accepting a value the reference would refuse.
const MAX_NANOS: u128 = i64::MAX as u128;

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
/// `<decimal number><unit>` pieces, or the bare string `"0"`. Negative non-zero values are rejected.
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let input = s;
    let syntax = || DurationError::Syntax {
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
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(syntax());
    }

    let mut total: u128 = 0;
    while !rest.is_empty() {
        // Integer part.
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_digits, after_int) = rest.split_at(int_len);
        rest = after_int;
        // Fractional part.
        let mut frac_digits = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            let (digits, after_frac) = after_dot.split_at(frac_len);
            frac_digits = digits;
            rest = after_frac;
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
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
        let overflow = || DurationError::Overflow {
            input: input.to_owned(),
        };

        let mut whole: u128 = 0;
        for d in int_digits.bytes() {
            whole = whole
                .checked_mul(10)
                .and_then(|w| w.checked_add(u128::from(d - b'0')))
                .filter(|w| *w <= MAX_NANOS)
                .ok_or_else(overflow)?;
        }
        let mut piece = whole
            .checked_mul(u128::from(per_unit))
            .filter(|p| *p <= MAX_NANOS)
            .ok_or_else(overflow)?;
        // Like Go, digits beyond what can change the result are ignored; 19 digits of fraction are
        // already below a nanosecond for every unit.
        let mut frac: u128 = 0;
        let mut scale: u128 = 1;
        for d in frac_digits.bytes().take(19) {
            frac = frac * 10 + u128::from(d - b'0');
            scale *= 10;
        }
        piece += frac * u128::from(per_unit) / scale;
        total = total
            .checked_add(piece)
            .filter(|t| *t <= MAX_NANOS)
            .ok_or_else(overflow)?;
    }
    if negative && total != 0 {
        return Err(DurationError::Negative {
            input: input.to_owned(),
        });
    }
    // `total <= i64::MAX` was checked above, so it fits in u64.
    let nanos = u64::try_from(total).map_err(|_| DurationError::Overflow {
        input: input.to_owned(),
    })?;
    Ok(Duration::from_nanos(nanos))
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
