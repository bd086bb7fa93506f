//! Logs as the reference writes them, so a log pipeline that parses its lines keeps working.
//!
//! The reference builds controller-runtime's zap logger with `Development: false`,
//! `Level: debug` and the RFC 3339 time encoder, then binds the `--zap-*` flags (`dwd.go`).
//! Its lines are therefore zap's production JSON on stderr, one object per line, keys in this
//! order: `level` (lowercase), `ts`, `logger`, `msg`, then the structured fields;
//! errors are a field `error` holding the message. `--zap-devel` or `--zap-encoder=console`
//! switch to zap's console layout (tab-separated, fields as a JSON object at the end).
//!
//! Here a [`ZapFormat`] (a tracing-subscriber [`FormatEvent`]) writes those layouts from
//! tracing events: `logger` is the event's target with the crate name shortened to `dwd` and
//! `::` turned into `.` (`dwd.prober.probe`), the fields of the enclosing spans (outermost
//! first, like a zap logger's `WithValues`) come before the event's own. `--log-format text`
//! keeps tracing-subscriber's own layout for people.
//!
//! Levels follow zap: `--zap-log-level` takes `debug`, `info`, `error`, `panic` or an integer
//! verbosity `n > 0` (zap level `-n`: 1 is debug, 2 and more also enable trace events, which
//! zap would print as `Level(-2)`). `warn` is accepted too (ours: tracing has a warn level and
//! we use it). The default is debug, as in the reference. `RUST_LOG`, when set, overrides the
//! level with a tracing filter.
//!
//! Every value a line carries (the message, each field, the logger name) passes through one
//! place, the field visitors here, whatever the call site: a value is cut to
//! [`LOG_VALUE_LIMIT`] bytes as written (escaped), marked `… (N bytes)` with its whole length,
//! and control characters are escaped in every layout (`\n`, `\t`, `\u001b`), so a shoot's
//! body, a Status message or a serde error quoting a tenant's string can neither make a line
//! megabytes long nor start a line of its own. kube-client's own lines (it logs an unparsable
//! 2xx body whole at warn) pass through the same visitors. A line with `n` fields is therefore
//! at most [`line_bound`]`(n)` bytes plus the names of its fields and spans (our code's, never
//! a tenant's). zap writes values whole and console messages raw.
//!
//! Not reproduced: zap's stack traces on error lines (`stacktrace`, a Go goroutine dump; there
//! is no equivalent worth printing, so `--zap-stacktrace-level` is validated and has no
//! effect), and zap's sampling (after 100 identical messages in a second, one in 100): our
//! periodic lines are debug-level and bounded by the number of shoots, so nothing is dropped.

use std::fmt::{self, Write as _};

use chrono::{DateTime, Utc};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The most bytes of one value (message, field, logger name) a log line carries as written,
/// before the `… (N bytes)` marker: the prober's cut of a shoot's error text
/// (`prober::probe::SHOOT_MESSAGE_LIMIT`, the same 300 bytes; a unit test holds them equal).
pub(crate) const LOG_VALUE_LIMIT: usize = 300;

/// The longest marker a cut value ends with: `… (` (5 bytes), a `usize` (20 digits), ` bytes)`.
const CUT_MARKER_MAX: usize = 5 + 20 + 7;

/// The most bytes a log line with `fields` fields (the event's own and its spans') takes in any
/// layout, not counting the names of those fields and spans (written by our code, never by a
/// tenant): a fixed part (level, time, separators) of 128 bytes, then the message, the logger
/// name and each field, each at most [`LOG_VALUE_LIMIT`] + 32 bytes (the marker) + 8 bytes of
/// quotes and separators. With the 300-byte limit: `128 + 340 × (fields + 2)`.
pub const fn line_bound(fields: usize) -> usize {
    128 + (LOG_VALUE_LIMIT + CUT_MARKER_MAX + 8) * (fields + 2)
}

/// What a value formats to, capped: the first [`LOG_VALUE_LIMIT`] bytes are kept (a value
/// escapes to at least as many bytes as it has, so more are never written) and the rest only
/// counted. A 16 MiB body costs its formatting, not a second 16 MiB copy.
#[derive(Default)]
struct Capped {
    kept: String,
    /// Bytes formatted in all.
    total: usize,
    /// Set once a piece did not fit whole: later, shorter pieces must not be kept after a gap.
    full: bool,
}

impl Capped {
    fn of(value: impl fmt::Display) -> Capped {
        let mut capped = Capped::default();
        let _ = write!(capped, "{value}");
        capped
    }
}

impl fmt::Write for Capped {
    fn write_str(&mut self, piece: &str) -> fmt::Result {
        self.total = self.total.saturating_add(piece.len());
        if !self.full {
            let room = LOG_VALUE_LIMIT - self.kept.len().min(LOG_VALUE_LIMIT);
            let kept = crate::text::prefix(piece, room);
            self.kept.push_str(kept);
            self.full = kept.len() < piece.len();
        }
        Ok(())
    }
}

/// How a value is escaped where it is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Escape {
    /// Inside a JSON string: `"`, `\` and control characters, as zap escapes.
    Json,
    /// Bare in a line (the console message, the text layout): control characters only, so
    /// nothing from a tenant ends a line or starts a forged one.
    Bare,
}

/// Writes `value` escaped, cut at [`LOG_VALUE_LIMIT`] bytes of escaped text (never inside an
/// escape or a character), with `… (N bytes)` (N the value's whole length) when cut.
fn write_bounded(out: &mut String, value: &Capped, escape: Escape) {
    let mut written = 0;
    let mut cut = value.total > value.kept.len();
    let mut buf = String::new();
    for c in value.kept.chars() {
        buf.clear();
        match c {
            '"' if escape == Escape::Json => buf.push_str("\\\""),
            '\\' if escape == Escape::Json => buf.push_str("\\\\"),
            '\n' => buf.push_str("\\n"),
            '\r' => buf.push_str("\\r"),
            '\t' => buf.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(buf, "\\u{:04x}", u32::from(c));
            }
            c => buf.push(c),
        }
        if written + buf.len() > LOG_VALUE_LIMIT {
            cut = true;
            break;
        }
        written += buf.len();
        out.push_str(&buf);
    }
    if cut {
        let _ = write!(out, "… ({} bytes)", value.total);
    }
}

/// [`write_bounded`] inside JSON quotes.
fn write_bounded_json(out: &mut String, value: &Capped) {
    out.push('"');
    write_bounded(out, value, Escape::Json);
    out.push('"');
}

/// A zap level (`--zap-log-level`): -1 debug, 0 info, 1 warn, 2 error, 4 panic; `-n` for an
/// integer verbosity `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ZapLevel(pub i8);

impl ZapLevel {
    /// zap's debug level, the reference's default.
    pub const DEBUG: ZapLevel = ZapLevel(-1);
    /// zap's info level.
    pub const INFO: ZapLevel = ZapLevel(0);
    /// zap's warn level.
    pub const WARN: ZapLevel = ZapLevel(1);
    /// zap's error level.
    pub const ERROR: ZapLevel = ZapLevel(2);
    /// zap's panic level: nothing of ours is that severe, so nothing is logged.
    pub(crate) const PANIC: ZapLevel = ZapLevel(4);

    /// Parses a flag value as controller-runtime does (`levelFlag.Set`): a name, case
    /// insensitive, or an integer > 0; anything else is an error. `warn` is ours.
    pub fn parse(value: &str) -> Result<ZapLevel, String> {
        match value.to_ascii_lowercase().as_str() {
            "debug" => Ok(Self::DEBUG),
            "info" => Ok(Self::INFO),
            "warn" => Ok(Self::WARN),
            "error" => Ok(Self::ERROR),
            "panic" => Ok(Self::PANIC),
            _ => match value.parse::<i64>() {
                // zap levels are int8: a verbosity beyond 128 means "everything" anyway.
                Ok(n) if n > 0 => Ok(ZapLevel(i8::try_from(-n).unwrap_or(i8::MIN))),
                _ => Err(format!(
                    "invalid log level {value:?}: one of debug, info, warn, error, panic, or an integer > 0"
                )),
            },
        }
    }

    /// The tracing filter level of this zap level (`off` for panic and above).
    pub(crate) fn directive(self) -> &'static str {
        match self.0 {
            i8::MIN..=-2 => "trace",
            -1 => "debug",
            0 => "info",
            1 => "warn",
            2 => "error",
            _ => "off",
        }
    }
}

/// The filter for `level` when `RUST_LOG` is not set: our crates at `level`; dependencies at
/// info at most (their debug output is about their internals, not the watchdog's work), and
/// the Kubernetes client and HTTP stack at warn at most (they report each request otherwise).
pub(crate) fn filter_directives(level: ZapLevel) -> String {
    let ours = level.directive();
    let others = level.max(ZapLevel::INFO).directive();
    let quiet = level.max(ZapLevel::WARN).directive();
    format!("{others},dependency_watchdog={ours},dwd_core={ours},kube={quiet},hyper={quiet}")
}

/// `--zap-encoder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZapEncoder {
    /// zap's production JSON.
    Json,
    /// zap's development console layout.
    Console,
}

impl ZapEncoder {
    /// Parses a flag value as controller-runtime does (`json` or `console`, any case).
    pub fn parse(value: &str) -> Result<ZapEncoder, String> {
        match value.to_ascii_lowercase().as_str() {
            "json" => Ok(ZapEncoder::Json),
            "console" => Ok(ZapEncoder::Console),
            _ => Err(format!(
                "invalid encoder value {value:?}: one of json, console"
            )),
        }
    }
}

/// `--zap-time-encoding`: how `ts` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeEncoding {
    /// Seconds since the Unix epoch, a float.
    Epoch,
    /// Milliseconds since the Unix epoch, a float.
    Millis,
    /// Nanoseconds since the Unix epoch, an integer.
    Nanos,
    /// `2006-01-02T15:04:05.000Z0700`.
    Iso8601,
    /// `2006-01-02T15:04:05Z07:00`: the reference's choice.
    Rfc3339,
    /// `2006-01-02T15:04:05.999999999Z07:00` (trailing zeros dropped).
    Rfc3339Nano,
}

impl TimeEncoding {
    /// Parses a flag value as controller-runtime does (any case).
    pub fn parse(value: &str) -> Result<TimeEncoding, String> {
        match value.to_ascii_lowercase().as_str() {
            "epoch" => Ok(TimeEncoding::Epoch),
            "millis" => Ok(TimeEncoding::Millis),
            "nanos" => Ok(TimeEncoding::Nanos),
            "iso8601" => Ok(TimeEncoding::Iso8601),
            "rfc3339" => Ok(TimeEncoding::Rfc3339),
            "rfc3339nano" => Ok(TimeEncoding::Rfc3339Nano),
            _ => Err(format!(
                "invalid time-encoding value {value:?}: one of epoch, millis, nanos, iso8601, rfc3339, rfc3339nano"
            )),
        }
    }

    /// Writes `t`; textual encodings are JSON strings when `quoted`.
    fn write(self, out: &mut String, t: DateTime<Utc>, quoted: bool) {
        // Nanoseconds fit an i64 until 2262; the fallback only keeps this total.
        let nanos = t
            .timestamp_nanos_opt()
            .unwrap_or_else(|| t.timestamp().saturating_mul(1_000_000_000));
        let text = match self {
            // Go divides the int64 nanoseconds as float64 and prints the shortest form that
            // reads back the same, without exponent: Rust's Display of f64 does the same.
            TimeEncoding::Epoch => {
                let _ = write!(out, "{}", nanos as f64 / 1e9);
                return;
            }
            TimeEncoding::Millis => {
                let _ = write!(out, "{}", nanos as f64 / 1e6);
                return;
            }
            TimeEncoding::Nanos => {
                let _ = write!(out, "{nanos}");
                return;
            }
            TimeEncoding::Iso8601 => t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
            TimeEncoding::Rfc3339 => t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            TimeEncoding::Rfc3339Nano => {
                let mut text = t.format("%Y-%m-%dT%H:%M:%S").to_string();
                let frac = format!("{:09}", t.timestamp_subsec_nanos());
                let frac = frac.trim_end_matches('0');
                if !frac.is_empty() {
                    text.push('.');
                    text.push_str(frac);
                }
                text.push('Z');
                text
            }
        };
        if quoted {
            write_json_str(out, &text);
        } else {
            out.push_str(&text);
        }
    }
}

/// `--zap-stacktrace-level`: validated like the reference's (info, error, panic), no effect.
pub(crate) fn parse_stacktrace_level(value: &str) -> Result<String, String> {
    match value.to_ascii_lowercase().as_str() {
        "info" | "error" | "panic" => Ok(value.to_ascii_lowercase()),
        _ => Err(format!(
            "invalid stacktrace level {value:?}: one of info, error, panic"
        )),
    }
}

/// Which layout the lines have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// zap's production JSON (the default).
    Json,
    /// zap's console layout (`--zap-devel`, `--zap-encoder=console`).
    Console,
    /// tracing-subscriber's layout (`--log-format text`).
    Text,
}

/// The effective logging settings of the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSettings {
    /// Layout.
    pub output: Output,
    /// Level.
    pub level: ZapLevel,
    /// How `ts` is written.
    pub time: TimeEncoding,
}

/// Installs the process's subscriber for `prober` and `weeder`: lines on stderr, as zap writes
/// them. Does nothing when a subscriber is already installed (tests). The settings come from
/// the flags (`LogSettings::from_args`, in the `cli` module: the command line depends on this
/// module, not the other way round).
pub fn init(settings: LogSettings) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(filter_directives(settings.level)));
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer(settings.output, settings.time, std::io::stderr))
        .try_init();
}

/// The formatting layer of `output` writing to `writer`: the one [`init`] installs, and the one
/// tests capture lines from. Every layout bounds and escapes its values here.
pub fn layer<S, W>(
    output: Output,
    time: TimeEncoding,
    writer: W,
) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync + 'static>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    match output {
        Output::Json | Output::Console => {
            let console = output == Output::Console;
            Box::new(
                tracing_subscriber::fmt::layer()
                    .with_writer(writer)
                    .with_ansi(false)
                    .fmt_fields(ZapFields { spaced: console })
                    .event_format(ZapFormat::new(console, time)),
            )
        }
        Output::Text => Box::new(
            tracing_subscriber::fmt::layer()
                .with_target(false)
                .with_writer(writer)
                .fmt_fields(TextFields),
        ),
    }
}

/// Formats events as zap's JSON or console encoder would.
#[derive(Debug, Clone)]
pub(crate) struct ZapFormat {
    console: bool,
    time: TimeEncoding,
    now: fn() -> DateTime<Utc>,
}

impl ZapFormat {
    /// JSON lines, or the console layout when `console`; `ts` written as `time` says.
    pub(crate) fn new(console: bool, time: TimeEncoding) -> ZapFormat {
        ZapFormat {
            console,
            time,
            now: Utc::now,
        }
    }

    #[cfg(test)]
    /// The same with a clock of the caller's (tests).
    pub(crate) fn with_clock(mut self, now: fn() -> DateTime<Utc>) -> ZapFormat {
        self.now = now;
        self
    }
}

/// zap's level names: lowercase in JSON, capitals in the console layout; levels zap has no
/// name for print as `Level(-2)` / `LEVEL(-2)`, which is what a verbosity of 2 looks like.
fn level_name(level: &Level, console: bool) -> &'static str {
    match (*level, console) {
        (Level::TRACE, false) => "Level(-2)",
        (Level::TRACE, true) => "LEVEL(-2)",
        (Level::DEBUG, false) => "debug",
        (Level::DEBUG, true) => "DEBUG",
        (Level::INFO, false) => "info",
        (Level::INFO, true) => "INFO",
        (Level::WARN, false) => "warn",
        (Level::WARN, true) => "WARN",
        (Level::ERROR, false) => "error",
        (Level::ERROR, true) => "ERROR",
    }
}

/// `dependency_watchdog::prober::probe` → `dwd.prober.probe`; `dwd_core::x` → `dwd.core.x`;
/// other crates keep their name, with `.` between modules as zap's named loggers have.
pub(crate) fn logger_name(target: &str) -> String {
    let (krate, rest) = match target.split_once("::") {
        Some((krate, rest)) => (krate, Some(rest)),
        None => (target, None),
    };
    let mut name = match krate {
        "dependency_watchdog" => "dwd".to_string(),
        "dwd_core" => "dwd.core".to_string(),
        other => other.to_string(),
    };
    if let Some(rest) = rest {
        name.push('.');
        name.push_str(&rest.replace("::", "."));
    }
    name
}

impl<S> FormatEvent<S, ZapFields> for ZapFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, ZapFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = String::new();
        let mut visitor = FieldWriter::new(&mut fields, self.console, true);
        event.record(&mut visitor);
        let message = visitor.message.take().unwrap_or_default();
        // A `log` record's target is the record's to choose: bounded like any value.
        let logger = match visitor.log_target.take() {
            Some(target) => Capped::of(logger_name(&target.kept)),
            None => Capped::of(logger_name(event.metadata().target())),
        };
        // Fields of the enclosing spans first (outermost first), then the event's own.
        let separator = if self.console { ", " } else { "," };
        let mut all = String::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                if let Some(own) = extensions.get::<FormattedFields<ZapFields>>()
                    && !own.fields.is_empty()
                {
                    if !all.is_empty() {
                        all.push_str(separator);
                    }
                    all.push_str(&own.fields);
                }
            }
        }
        if !fields.is_empty() {
            if !all.is_empty() {
                all.push_str(separator);
            }
            all.push_str(&fields);
        }

        let level = level_name(event.metadata().level(), self.console);
        let now = (self.now)();
        let mut line = String::with_capacity(128 + all.len() + message.kept.len());
        if self.console {
            self.time.write(&mut line, now, false);
            line.push('\t');
            line.push_str(level);
            line.push('\t');
            write_bounded(&mut line, &logger, Escape::Bare);
            line.push('\t');
            write_bounded(&mut line, &message, Escape::Bare);
            if !all.is_empty() {
                line.push_str("\t{");
                line.push_str(&all);
                line.push('}');
            }
        } else {
            line.push_str("{\"level\":\"");
            line.push_str(level);
            line.push_str("\",\"ts\":");
            self.time.write(&mut line, now, true);
            line.push_str(",\"logger\":");
            write_bounded_json(&mut line, &logger);
            line.push_str(",\"msg\":");
            write_bounded_json(&mut line, &message);
            if !all.is_empty() {
                line.push(',');
                line.push_str(&all);
            }
            line.push('}');
        }
        line.push('\n');
        writer.write_str(&line)
    }
}

/// Formats span fields as JSON members (`"k":v,"k2":v2`; spaced for the console layout) for
/// [`ZapFormat`] to splice into each line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ZapFields {
    spaced: bool,
}

impl ZapFields {
    #[cfg(test)]
    /// Compact members for JSON lines, or spaced (`"k": v, "k2": v2`) like zap's console.
    pub(crate) fn new(spaced: bool) -> ZapFields {
        ZapFields { spaced }
    }
}

impl<'writer> FormatFields<'writer> for ZapFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut out = String::new();
        fields.record(&mut FieldWriter::new(&mut out, self.spaced, false));
        writer.write_str(&out)
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut out = String::new();
        fields.record(&mut FieldWriter::new(&mut out, self.spaced, false));
        if out.is_empty() {
            return Ok(());
        }
        if !current.fields.is_empty() {
            current
                .fields
                .push_str(if self.spaced { ", " } else { "," });
        }
        current.fields.push_str(&out);
        Ok(())
    }
}

/// Writes each field as a JSON member, its value bounded ([`write_bounded`]); takes an
/// event's `message` (and a `log` record's target) aside instead.
struct FieldWriter<'a> {
    out: &'a mut String,
    spaced: bool,
    is_event: bool,
    message: Option<Capped>,
    log_target: Option<Capped>,
}

impl<'a> FieldWriter<'a> {
    fn new(out: &'a mut String, spaced: bool, is_event: bool) -> Self {
        FieldWriter {
            out,
            spaced,
            is_event,
            message: None,
            log_target: None,
        }
    }

    /// Starts a member named `name`; false when the field is not written as a member.
    fn key(&mut self, name: &str) -> bool {
        // Events bridged from the `log` crate carry their origin as `log.*` fields; the
        // target becomes the logger name, the rest (file, line, module) is noise.
        if name.starts_with("log.") {
            return false;
        }
        if !self.out.is_empty() {
            self.out.push_str(if self.spaced { ", " } else { "," });
        }
        write_json_str(self.out, name);
        self.out.push_str(if self.spaced { ": " } else { ":" });
        true
    }

    fn text(&mut self, field: &Field, value: Capped) {
        match field.name() {
            "message" if self.is_event => self.message = Some(value),
            "log.target" if self.is_event => self.log_target = Some(value),
            name => {
                if self.key(name) {
                    write_bounded_json(self.out, &value);
                }
            }
        }
    }

    /// A number or a bool: short by nature, written bare.
    fn raw(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if field.name() == "message" && self.is_event {
            self.message = Some(Capped::of(value));
        } else if self.key(field.name()) {
            let _ = self.out.write_fmt(value);
        }
    }
}

impl Visit for FieldWriter<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == RECORD_FIELD {
            let text = format!("{value:?}");
            if is_record_object(&text) && self.key(field.name()) {
                self.out.push_str(&text);
                return;
            }
        }
        self.text(field, Capped::of(format_args!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, Capped::of(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinities; zap writes them as these strings.
        if value.is_nan() {
            self.text(field, Capped::of("NaN"));
        } else if value.is_infinite() {
            self.text(field, Capped::of(if value > 0.0 { "+Inf" } else { "-Inf" }));
        } else {
            self.raw(field, format_args!("{value}"));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.text(field, Capped::of(value));
    }
}

/// The field whose value, a decision record's JSON object ([`crate::decisions`]), the JSON
/// and console layouts write raw (an object, not a string).
pub const RECORD_FIELD: &str = "record";

/// The most bytes of a decision record a line carries whole: far above
/// [`dwd_core::record::record_bound`] of any real config (16.75 KiB for three targets).
pub(crate) const RECORD_LINE_LIMIT: usize = 64 << 10;

/// Whether `text`, the value of a [`RECORD_FIELD`], is written raw: one
/// JSON object on one line, within [`RECORD_LINE_LIMIT`]. Only our code names that field and
/// serde writes its value, so this holds; anything else is written as any other value
/// (quoted, cut), so no value can break a line's JSON.
fn is_record_object(text: &str) -> bool {
    text.len() <= RECORD_LINE_LIMIT
        && text.starts_with('{')
        && !text.contains(['\n', '\r'])
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// The text layout's fields (`--log-format text`): tracing-subscriber's own (`message` first,
/// then ` key=value`), each value bounded and its control characters escaped
/// ([`write_bounded`]); a string value is written without quotes, as tracing-subscriber does.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = TextFieldWriter::default();
        fields.record(&mut visitor);
        let mut out = String::new();
        if let Some(message) = &visitor.message {
            write_bounded(&mut out, message, Escape::Bare);
        }
        for (name, value) in &visitor.fields {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(name);
            out.push('=');
            write_bounded(&mut out, value, Escape::Bare);
        }
        writer.write_str(&out)
    }
}

/// Collects the text layout's fields, capped, in the order they come.
#[derive(Default)]
struct TextFieldWriter {
    message: Option<Capped>,
    fields: Vec<(&'static str, Capped)>,
}

impl TextFieldWriter {
    fn push(&mut self, field: &Field, value: Capped) {
        match field.name() {
            "message" => self.message = Some(value),
            name if name.starts_with("log.") => {}
            name => self.fields.push((name, value)),
        }
    }
}

impl Visit for TextFieldWriter {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, Capped::of(format_args!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, Capped::of(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.push(field, Capped::of(value));
    }
}

/// Writes `s` as a JSON string, escaped as zap escapes: `"`, `\` and control characters.
fn write_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Where a test's `tracing` subscriber writes, so the test can read its log lines back
/// (clone it into `with_writer(move || buffer.clone())`). Used here and by the scaler's tests.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl LogBuffer {
    /// The bytes written so far.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.0.lock().expect("log buffer").clone()
    }
}

#[cfg(test)]
impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::{debug, error, info, info_span, trace, warn};
    use tracing_subscriber::layer::SubscriberExt;

    fn fixed_now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_714_557_600, 123_450_000).expect("valid instant")
    }

    /// The lines `emit` logs through a [`ZapFormat`] at `level`.
    fn capture(console: bool, time: TimeEncoding, level: ZapLevel, emit: impl FnOnce()) -> String {
        let buffer = LogBuffer::default();
        let sink = buffer.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .fmt_fields(ZapFields::new(console))
            .event_format(ZapFormat::new(console, time).with_clock(fixed_now));
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new(filter_directives(level)))
            .with(layer);
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(buffer.bytes()).expect("utf-8")
    }

    fn json_lines(text: &str) -> Vec<serde_json::Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn json_lines_have_zaps_keys_in_zaps_order_then_the_fields() {
        let text = capture(false, TimeEncoding::Rfc3339, ZapLevel::DEBUG, || {
            let error = std::io::Error::other("boom \"quoted\"\nsecond line");
            info!(shoot = "shoot--p--s", count = 3u64, delta = -2i64, ok = true, fraction = 0.5,
                error = %error, wait = ?std::time::Duration::from_millis(1500), "probe started");
        });
        assert_eq!(
            text,
            concat!(
                r#"{"level":"info","ts":"2024-05-01T10:00:00Z","logger":"dwd.observe.logging.tests","msg":"probe started","#,
                r#""shoot":"shoot--p--s","count":3,"delta":-2,"ok":true,"fraction":0.5,"#,
                r#""error":"boom \"quoted\"\nsecond line","wait":"1.5s"}"#,
                "\n"
            )
        );
        let line = &json_lines(&text)[0];
        assert_eq!(line["error"], "boom \"quoted\"\nsecond line");
    }

    #[test]
    fn a_decision_record_is_written_whole_as_an_object_and_anything_else_under_its_name_as_text() {
        let record = r#"{"schema":"s","id":"ns/1.0","nested":{"n":[1,2.5,null],"t":"a\"b"}}"#;
        let long = format!(r#"{{"pad":"{}"}}"#, "x".repeat(RECORD_LINE_LIMIT));
        for console in [false, true] {
            let text = capture(console, TimeEncoding::Rfc3339, ZapLevel::DEBUG, || {
                info!(decision_id = "ns/1.0", record = %record, "decision record");
                info!(record = "{\"not\": closed", "not an object");
                info!(record = %long, "too long");
            });
            let objects: Vec<serde_json::Value> = text
                .lines()
                .map(|l| {
                    let at = if console {
                        l.find("\t{").expect("fields") + 1
                    } else {
                        0
                    };
                    serde_json::from_str(&l[at..]).unwrap_or_else(|e| panic!("{e}: {l}"))
                })
                .collect();
            assert_eq!(objects[0]["record"]["nested"]["t"], "a\"b", "{text}");
            assert_eq!(objects[0]["record"]["id"], "ns/1.0");
            assert_eq!(objects[1]["record"], "{\"not\": closed");
            let cut = objects[2]["record"].as_str().expect("a string");
            assert!(cut.len() < 400 && cut.ends_with(" bytes)"), "{cut}");
        }
    }

    #[test]
    fn span_fields_come_first_outermost_first_and_recorded_ones_are_added() {
        let text = capture(false, TimeEncoding::Rfc3339, ZapLevel::DEBUG, || {
            let probe = info_span!("probe", shoot = "shoot--a", attempt = tracing::field::Empty);
            let _p = probe.enter();
            probe.record("attempt", 2u64);
            let scale = info_span!(
                "scale",
                target = "kube-controller-manager",
                scale_level = 1u64
            );
            let _s = scale.enter();
            warn!(replicas = 0u64, "scaled");
        });
        assert_eq!(
            text,
            concat!(
                r#"{"level":"warn","ts":"2024-05-01T10:00:00Z","logger":"dwd.observe.logging.tests","msg":"scaled","#,
                r#""shoot":"shoot--a","attempt":2,"target":"kube-controller-manager","scale_level":1,"replicas":0}"#,
                "\n"
            )
        );
    }

    #[test]
    fn levels_are_zaps_names_and_the_filter_follows_zap_levels() {
        let text = capture(false, TimeEncoding::Rfc3339, ZapLevel(-2), || {
            trace!("t");
            debug!("d");
            info!("i");
            warn!("w");
            error!("e");
        });
        let levels: Vec<String> = json_lines(&text)
            .iter()
            .map(|l| l["level"].as_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(levels, ["Level(-2)", "debug", "info", "warn", "error"]);

        let text = capture(false, TimeEncoding::Rfc3339, ZapLevel::INFO, || {
            debug!("d");
            info!("i");
        });
        assert_eq!(json_lines(&text).len(), 1, "{text}");
        let text = capture(false, TimeEncoding::Rfc3339, ZapLevel::ERROR, || {
            warn!("w");
            error!("e");
        });
        assert_eq!(json_lines(&text)[0]["msg"], "e");
        assert_eq!(json_lines(&text).len(), 1);
        let text = capture(false, TimeEncoding::Rfc3339, ZapLevel::PANIC, || {
            error!("e")
        });
        assert_eq!(text, "");
    }

    #[test]
    fn console_layout_is_zaps_development_layout() {
        let text = capture(true, TimeEncoding::Rfc3339, ZapLevel::DEBUG, || {
            let span = info_span!("probe", shoot = "shoot--a");
            let _s = span.enter();
            info!(count = 3u64, "probe started");
            debug!("no fields");
        });
        let span_less = capture(true, TimeEncoding::Rfc3339, ZapLevel::DEBUG, || {
            debug!("no fields");
        });
        assert_eq!(
            text,
            "2024-05-01T10:00:00Z\tINFO\tdwd.observe.logging.tests\tprobe started\t{\"shoot\": \"shoot--a\", \"count\": 3}\n\
             2024-05-01T10:00:00Z\tDEBUG\tdwd.observe.logging.tests\tno fields\t{\"shoot\": \"shoot--a\"}\n"
        );
        assert_eq!(
            span_less,
            "2024-05-01T10:00:00Z\tDEBUG\tdwd.observe.logging.tests\tno fields\n"
        );
    }

    #[test]
    fn every_time_encoding_writes_ts_as_zap_does() {
        let ts = |time| {
            let text = capture(false, time, ZapLevel::INFO, || info!("x"));
            json_lines(&text)[0]["ts"].clone()
        };
        assert_eq!(ts(TimeEncoding::Rfc3339), "2024-05-01T10:00:00Z");
        assert_eq!(ts(TimeEncoding::Rfc3339Nano), "2024-05-01T10:00:00.12345Z");
        assert_eq!(ts(TimeEncoding::Iso8601), "2024-05-01T10:00:00.123Z");
        assert_eq!(
            ts(TimeEncoding::Epoch),
            serde_json::json!(1_714_557_600.123_45)
        );
        // Like zap: float64(UnixNano) / 1e6, printed in the shortest form that reads back.
        assert_eq!(
            ts(TimeEncoding::Millis),
            serde_json::json!(1_714_557_600_123.450_2)
        );
        assert_eq!(
            ts(TimeEncoding::Nanos),
            serde_json::json!(1_714_557_600_123_450_000u64)
        );
        let text = capture(true, TimeEncoding::Epoch, ZapLevel::INFO, || info!("x"));
        assert!(text.starts_with("1714557600.12345\tINFO\t"), "{text}");
        let mut whole = String::new();
        TimeEncoding::Rfc3339Nano.write(
            &mut whole,
            DateTime::from_timestamp(1_714_557_600, 0).expect("instant"),
            false,
        );
        assert_eq!(whole, "2024-05-01T10:00:00Z");
    }

    #[test]
    fn odd_values_stay_valid_json() {
        let text = capture(false, TimeEncoding::Rfc3339, ZapLevel::INFO, || {
            info!(
                nan = f64::NAN,
                inf = f64::INFINITY,
                ctl = "a\u{1}b",
                "tab\there"
            );
        });
        let line = &json_lines(&text)[0];
        assert_eq!(line["nan"], "NaN");
        assert_eq!(line["inf"], "+Inf");
        assert_eq!(line["ctl"], "a\u{1}b");
        assert_eq!(line["msg"], "tab\there");
        assert!(text.contains(r#""ctl":"a\u0001b""#), "{text}");
    }

    #[test]
    fn zap_log_level_takes_zaps_values() {
        assert_eq!(ZapLevel::parse("INFO"), Ok(ZapLevel::INFO));
        assert_eq!(ZapLevel::parse("debug"), Ok(ZapLevel::DEBUG));
        assert_eq!(ZapLevel::parse("Error"), Ok(ZapLevel::ERROR));
        assert_eq!(ZapLevel::parse("panic"), Ok(ZapLevel::PANIC));
        assert_eq!(ZapLevel::parse("warn"), Ok(ZapLevel::WARN));
        assert_eq!(ZapLevel::parse("1"), Ok(ZapLevel::DEBUG));
        assert_eq!(ZapLevel::parse("3"), Ok(ZapLevel(-3)));
        assert_eq!(ZapLevel::parse("1000"), Ok(ZapLevel(i8::MIN)));
        for bad in ["0", "-1", "verbose", "", "dpanic", "fatal"] {
            assert!(ZapLevel::parse(bad).is_err(), "{bad:?} must be rejected");
        }
        assert_eq!(ZapLevel(-3).directive(), "trace");
        assert_eq!(ZapLevel::PANIC.directive(), "off");
        assert_eq!(
            filter_directives(ZapLevel::DEBUG),
            "info,dependency_watchdog=debug,dwd_core=debug,kube=warn,hyper=warn"
        );
        assert_eq!(
            filter_directives(ZapLevel::ERROR),
            "error,dependency_watchdog=error,dwd_core=error,kube=error,hyper=error"
        );
        assert!(ZapEncoder::parse("CONSOLE").is_ok() && ZapEncoder::parse("text").is_err());
        assert!(TimeEncoding::parse("RFC3339Nano").is_ok() && TimeEncoding::parse("nano").is_err());
        assert!(
            parse_stacktrace_level("Error").is_ok() && parse_stacktrace_level("debug").is_err()
        );
    }

    #[test]
    fn values_are_cut_after_escaping_never_inside_an_escape_or_a_character() {
        // The same cut as the prober's for a shoot's error text.
        assert_eq!(LOG_VALUE_LIMIT, crate::prober::probe::SHOOT_MESSAGE_LIMIT);
        let written = |value: &str, escape| {
            let mut out = String::new();
            write_bounded(&mut out, &Capped::of(value), escape);
            out
        };
        assert_eq!(written("short\nline", Escape::Bare), "short\\nline");
        assert_eq!(written("a\u{1b}[31m\"", Escape::Bare), "a\\u001b[31m\"");
        // 299 bytes, then an escape of 2 that would pass the limit: cut before it.
        let value = format!("{}\n{}", "y".repeat(299), "z".repeat(10));
        assert_eq!(
            written(&value, Escape::Bare),
            format!("{}… (310 bytes)", "y".repeat(299))
        );
        // Characters of 3 bytes: 100 fit exactly, the 101st is cut whole.
        let value = "≥".repeat(101);
        assert_eq!(
            written(&value, Escape::Json),
            format!("{}… (303 bytes)", "≥".repeat(100))
        );
        // Pieces written one by one: nothing after the first piece that did not fit.
        let mut capped = Capped::default();
        let _ = capped.write_str(&"a".repeat(299));
        let _ = capped.write_str("≥");
        let _ = capped.write_str("b");
        assert_eq!(capped.kept, "a".repeat(299));
        assert_eq!(capped.total, 303);
        let text = capture(true, TimeEncoding::Rfc3339, ZapLevel::INFO, || {
            info!("two\nlines");
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(line_bound(0) < 1024 && line_bound(3) == 128 + 340 * 5);
    }

    #[test]
    fn logger_names_are_dotted_with_the_crate_shortened() {
        assert_eq!(logger_name("dependency_watchdog"), "dwd");
        assert_eq!(
            logger_name("dependency_watchdog::prober::probe"),
            "dwd.prober.probe"
        );
        assert_eq!(logger_name("dwd_core::lease"), "dwd.core.lease");
        assert_eq!(logger_name("kube_runtime::watcher"), "kube_runtime.watcher");
    }
}
