//! Reads a config file into the value the reference's decoder sees.
//!
//! The reference reads its configs with `sigs.k8s.io/yaml`: go-yaml v2 decodes the YAML into
//! `interface{}` with YAML 1.1 rules, the tree is converted to JSON, and `encoding/json` decodes
//! that into the config structs. Every step changes what a file means, so a drop-in must repeat
//! them, not just "parse YAML":
//!
//! - plain scalars resolve with go-yaml v2's table: `yes`/`no`/`on`/`off`/`y`/`n` are booleans,
//!   `010` is 8, `0x1F` is 31, `1_000` is 1000, `1.0` is a float, `.nan`/`.inf` are floats,
//!   `~` and the empty scalar are null, timestamps stay strings;
//! - only the first document of a stream is read;
//! - merge keys (`<<`) insert the merged mapping's entries *at their position*: keys after the
//!   `<<` override merged ones, keys before it are overridden (go-yaml v2's order);
//! - mapping keys that are numbers or booleans become strings (`1` → `"1"`, `yes` → `"true"`,
//!   floats as Go's `%g` of a float32); null and collection keys are errors;
//! - a number or boolean given where the config wants a string becomes that string (`name: 123`,
//!   `values: [on]` is `"true"`), which [`super::Fields`] does since only it knows the target type;
//! - a NaN or infinity that is not turned into a string makes the whole file invalid (JSON has no
//!   such numbers).
//!
//! The parser is `granit-parser` (re-exported by `serde-saphyr`), which reports each scalar's
//! style and tag so the resolution above can be applied exactly.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle};

/// A decoded YAML value, as `encoding/json` will see it after `sigs.k8s.io/yaml`'s conversion.
/// Scalars keep the text they were written as, so warnings can show how a value was read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GoValue {
    Null,
    Bool(bool, String),
    Int(i64, String),
    /// An integer above `i64::MAX` (go-yaml gives `uint64` for those).
    Uint(u64, String),
    Float(f64, String),
    Str(String),
    Seq(Vec<GoValue>),
    Map(GoMap),
}

/// A mapping's entries, keys in byte order: `json.Marshal` sorts a map's keys, and the order
/// decides which of two keys that match one field case-insensitively wins.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct GoMap {
    pub(crate) entries: BTreeMap<String, GoValue>,
    /// For keys whose string differs from how they were written (`n` → `false`, `010` → `8`):
    /// the written text, so that a warning can point the surprise out.
    pub(crate) written: BTreeMap<String, String>,
}

impl std::ops::Deref for GoMap {
    type Target = BTreeMap<String, GoValue>;

    fn deref(&self) -> &Self::Target {
        &self.entries
    }
}

/// Why a file could not be read as YAML (the reference fails the same way, with go-yaml's words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlError(pub(crate) String);

/// Deepest nesting we follow; go-yaml v2 itself stops at 10000, config files never come close.
const MAX_DEPTH: usize = 1000;
/// Most nodes an alias-expanded document may have, against "billion laughs" files (go-yaml v2
/// rejects those as "excessive aliasing").
const MAX_NODES: usize = 1_000_000;
/// Most bytes of scalar text (keys and values) an alias-expanded document may have. Counting
/// nodes alone is not enough: each alias of a scalar becomes a copy of its text, so one
/// 500 KiB anchored scalar aliased a million times is one million nodes but 500 GB once
/// expanded. The budget is spent before a scalar is copied, so a file is refused with at most
/// this much text held. 16 MiB: a real config (cluster-independent, a few hundred lines) is
/// well under 100 KiB, so any plausible config, generated ones included, fits a hundred times
/// over, while the expanded tree stays a small part of the watchdog's memory limit.
const MAX_SCALAR_BYTES: usize = 16 << 20;

/// What resolving may still spend: nodes and bytes of scalar text.
struct Budget {
    nodes: usize,
    bytes: usize,
}

impl Budget {
    fn new() -> Self {
        Budget {
            nodes: MAX_NODES,
            bytes: MAX_SCALAR_BYTES,
        }
    }

    /// One more node.
    fn node(&mut self) -> Result<(), YamlError> {
        self.nodes = self.nodes.checked_sub(1).ok_or_else(|| {
            YamlError(
                "document contains excessive aliasing (too many nodes once expanded)".to_owned(),
            )
        })?;
        Ok(())
    }

    /// A scalar's text, before it is copied into the resolved value.
    fn text(&mut self, value: &str) -> Result<(), YamlError> {
        self.bytes = self.bytes.checked_sub(value.len()).ok_or_else(|| {
            YamlError(format!(
                "document contains excessive aliasing (more than {} MiB of text once aliases \
                 are expanded)",
                MAX_SCALAR_BYTES >> 20
            ))
        })?;
        Ok(())
    }
}

/// A node as parsed, before resolution. Aliases share the anchored node.
#[derive(Debug)]
enum Raw {
    Scalar {
        value: String,
        style: ScalarStyle,
        tag: Tag,
    },
    Seq(Vec<Rc<Raw>>),
    Map(Vec<(Rc<Raw>, Rc<Raw>)>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tag {
    None,
    /// `!!name` (`tag:yaml.org,2002:name`).
    Core(String),
    /// Any other tag: go-yaml v2 leaves such scalars as strings.
    Other,
}

/// Reads the first document of `text`. An empty stream is `Null`, as with go-yaml.
pub(crate) fn load(text: &str) -> Result<GoValue, YamlError> {
    let raw = parse_first_document(text)?;
    let Some(raw) = raw else {
        return Ok(GoValue::Null);
    };
    let mut budget = Budget::new();
    resolve_node(&raw, &mut budget, 0)
}

fn parse_first_document(text: &str) -> Result<Option<Rc<Raw>>, YamlError> {
    let mut parser = Parser::new_from_str(text);
    let mut builder = Builder::default();
    loop {
        let Some(next) = parser.next_event() else {
            return Ok(None);
        };
        let (event, _span) = next.map_err(|e| YamlError(e.to_string()))?;
        match event {
            Event::StreamStart => {}
            Event::StreamEnd => return Ok(None),
            Event::DocumentStart(..) => {
                let root = builder.node(&mut parser, 0)?;
                // Only the first document counts; go-yaml v2's Unmarshal never looks further.
                return Ok(Some(root));
            }
            _ => {}
        }
    }
}

#[derive(Default)]
struct Builder {
    anchors: HashMap<usize, Rc<Raw>>,
}

impl Builder {
    fn next<'a>(
        parser: &mut Parser<'a, serde_saphyr::granit_parser::StrInput<'a>>,
    ) -> Result<Event<'a>, YamlError> {
        match parser.next_event() {
            Some(Ok((event, _))) => Ok(event),
            Some(Err(e)) => Err(YamlError(e.to_string())),
            None => Err(YamlError("unexpected end of the YAML stream".to_owned())),
        }
    }

    /// Reads one node (the next node event and, for collections, everything up to its end).
    fn node<'a>(
        &mut self,
        parser: &mut Parser<'a, serde_saphyr::granit_parser::StrInput<'a>>,
        depth: usize,
    ) -> Result<Rc<Raw>, YamlError> {
        loop {
            let event = Self::next(parser)?;
            if let Some(node) = self.node_from(event, parser, depth)? {
                return Ok(node);
            }
        }
    }

    /// Builds the node that `event` starts; `None` for events that carry no node (comments,
    /// anchor metadata), after which the caller reads on.
    fn node_from<'a>(
        &mut self,
        event: Event<'a>,
        parser: &mut Parser<'a, serde_saphyr::granit_parser::StrInput<'a>>,
        depth: usize,
    ) -> Result<Option<Rc<Raw>>, YamlError> {
        if depth > MAX_DEPTH {
            return Err(YamlError(format!(
                "document nested deeper than {MAX_DEPTH} levels"
            )));
        }
        let (node, anchor) = match event {
            Event::Scalar(value, style, anchor, tag) => {
                let tag = match tag {
                    None => Tag::None,
                    Some(t) => match t.suffix_in_namespace("tag:yaml.org,2002:") {
                        Some(name) => Tag::Core(name.into_owned()),
                        None => Tag::Other,
                    },
                };
                let node = Raw::Scalar {
                    value: value.into_owned(),
                    style,
                    tag,
                };
                (node, anchor)
            }
            Event::SequenceStart(_, anchor, _) => {
                let mut items = Vec::new();
                loop {
                    let event = Self::next(parser)?;
                    if matches!(event, Event::SequenceEnd) {
                        break;
                    }
                    if let Some(item) = self.node_from(event, parser, depth + 1)? {
                        items.push(item);
                    }
                }
                (Raw::Seq(items), anchor)
            }
            Event::MappingStart(_, anchor, _) => {
                let mut entries = Vec::new();
                let mut key: Option<Rc<Raw>> = None;
                loop {
                    let event = Self::next(parser)?;
                    if matches!(event, Event::MappingEnd) {
                        break;
                    }
                    if let Some(node) = self.node_from(event, parser, depth + 1)? {
                        match key.take() {
                            None => key = Some(node),
                            Some(k) => entries.push((k, node)),
                        }
                    }
                }
                if key.is_some() {
                    return Err(YamlError("mapping key without a value".to_owned()));
                }
                (Raw::Map(entries), anchor)
            }
            Event::Alias(id) => {
                return match self.anchors.get(&id) {
                    Some(node) => Ok(Some(node.clone())),
                    // The parser resolves names to ids; an id we don't hold is an alias to an
                    // anchor whose node is still being read (a node containing itself).
                    None => Err(YamlError(
                        "an alias refers to an anchor whose value contains the alias".to_owned(),
                    )),
                };
            }
            Event::SequenceEnd | Event::MappingEnd => {
                return Err(YamlError("unexpected end of a collection".to_owned()));
            }
            Event::DocumentEnd | Event::StreamEnd => {
                // `---` with nothing after it: an empty document is a null node.
                let node = Raw::Scalar {
                    value: String::new(),
                    style: ScalarStyle::Plain,
                    tag: Tag::None,
                };
                return Ok(Some(Rc::new(node)));
            }
            _ => return Ok(None),
        };
        let node = Rc::new(node);
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        Ok(Some(node))
    }
}

fn resolve_node(node: &Raw, budget: &mut Budget, depth: usize) -> Result<GoValue, YamlError> {
    budget.node()?;
    if depth > MAX_DEPTH {
        return Err(YamlError(format!(
            "document nested deeper than {MAX_DEPTH} levels"
        )));
    }
    match node {
        Raw::Scalar { value, style, tag } => {
            budget.text(value)?;
            resolve_scalar(value, *style, tag)
        }
        Raw::Seq(items) => items
            .iter()
            .map(|i| resolve_node(i, budget, depth + 1))
            .collect::<Result<_, _>>()
            .map(GoValue::Seq),
        Raw::Map(entries) => {
            let mut map = GoMap::default();
            resolve_entries(entries, &mut map, budget, depth)?;
            Ok(GoValue::Map(map))
        }
    }
}

/// Adds a mapping's entries to `map` in document order, later keys replacing earlier ones, with
/// merge keys expanded where they stand (go-yaml v2 `decoder.mapping` and `decoder.merge`).
fn resolve_entries(
    entries: &[(Rc<Raw>, Rc<Raw>)],
    map: &mut GoMap,
    budget: &mut Budget,
    depth: usize,
) -> Result<(), YamlError> {
    for (key, value) in entries {
        if is_merge_key(key) {
            merge(value, map, budget, depth)?;
            continue;
        }
        budget.node()?;
        let (key, written) = match key.as_ref() {
            Raw::Scalar { value, style, tag } => {
                budget.text(value)?;
                (map_key(resolve_scalar(value, *style, tag)?)?, value)
            }
            Raw::Seq(_) | Raw::Map(_) => {
                return Err(YamlError(
                    "invalid map key: a list or mapping cannot be a key".to_owned(),
                ));
            }
        };
        let value = resolve_node(value, budget, depth + 1)?;
        if key == *written {
            map.written.remove(&key);
        } else {
            map.written.insert(key.clone(), written.clone());
        }
        map.entries.insert(key, value);
    }
    Ok(())
}

fn is_merge_key(node: &Raw) -> bool {
    match node {
        Raw::Scalar { value, style, tag } => {
            value == "<<"
                && match tag {
                    Tag::None => *style == ScalarStyle::Plain,
                    Tag::Core(name) => name == "merge",
                    Tag::Other => false,
                }
        }
        _ => false,
    }
}

fn merge(value: &Raw, map: &mut GoMap, budget: &mut Budget, depth: usize) -> Result<(), YamlError> {
    const WANT_MAP: &str = "map merge requires map or sequence of maps as the value";
    match value {
        Raw::Map(entries) => resolve_entries(entries, map, budget, depth),
        Raw::Seq(items) => {
            // Earlier mappings take precedence, so go-yaml merges them last.
            for item in items.iter().rev() {
                match item.as_ref() {
                    Raw::Map(entries) => resolve_entries(entries, map, budget, depth)?,
                    _ => return Err(YamlError(WANT_MAP.to_owned())),
                }
            }
            Ok(())
        }
        Raw::Scalar { .. } => Err(YamlError(WANT_MAP.to_owned())),
    }
}

/// A mapping key as `sigs.k8s.io/yaml` turns it into a JSON object key.
fn map_key(key: GoValue) -> Result<String, YamlError> {
    match key {
        GoValue::Str(s) => Ok(s),
        GoValue::Int(i, _) => Ok(i.to_string()),
        GoValue::Bool(b, _) => Ok(b.to_string()),
        GoValue::Float(f, _) => Ok(match format_float32_g(f).as_str() {
            "+Inf" => ".inf".to_owned(),
            "-Inf" => "-.inf".to_owned(),
            "NaN" => ".nan".to_owned(),
            other => other.to_owned(),
        }),
        GoValue::Null => Err(YamlError("unsupported map key: null".to_owned())),
        GoValue::Uint(u, _) => Err(YamlError(format!(
            "unsupported map key of type uint64: {u}"
        ))),
        GoValue::Seq(_) | GoValue::Map(_) => Err(YamlError(
            "invalid map key: a list or mapping cannot be a key".to_owned(),
        )),
    }
}

fn resolve_scalar(value: &str, style: ScalarStyle, tag: &Tag) -> Result<GoValue, YamlError> {
    match tag {
        // A quoted or block scalar without a tag is a string, whatever it looks like.
        Tag::None if style != ScalarStyle::Plain => Ok(GoValue::Str(value.to_owned())),
        Tag::None => Ok(resolve_plain(value, false)),
        Tag::Other => Ok(GoValue::Str(value.to_owned())),
        Tag::Core(name) => resolve_tagged(value, name),
    }
}

/// go-yaml v2 `resolve(tag, in)` for an explicit core tag, including its check that the value
/// really is of that type (`!!int abc` is an error; `!!float 2` is the float 2).
fn resolve_tagged(value: &str, tag: &str) -> Result<GoValue, YamlError> {
    let resolved = match tag {
        "str" => return Ok(GoValue::Str(value.to_owned())),
        "binary" => return decode_base64(value).map(GoValue::Str),
        "bool" | "int" | "float" | "null" | "timestamp" => resolve_plain(value, tag == "timestamp"),
        // `!!map`, `!!seq` or an unknown core tag on a scalar: go-yaml keeps the text.
        _ => return Ok(GoValue::Str(value.to_owned())),
    };
    let fits = match (&resolved, tag) {
        (GoValue::Bool(..), "bool")
        | (GoValue::Int(..) | GoValue::Uint(..), "int")
        | (GoValue::Float(..), "float")
        | (GoValue::Null, "null") => true,
        (GoValue::Str(_), "timestamp") => looks_like_timestamp(value),
        _ => false,
    };
    if fits {
        return Ok(resolved);
    }
    match (resolved, tag) {
        (GoValue::Int(i, text), "float") => Ok(GoValue::Float(i as f64, text)),
        (GoValue::Uint(u, text), "float") => Ok(GoValue::Float(u as f64, text)),
        _ => Err(YamlError(format!("cannot decode `{value}` as a !!{tag}"))),
    }
}

/// go-yaml v2 `resolve("", in)`: what an untagged plain scalar means.
fn resolve_plain(text: &str, _timestamp_tag: bool) -> GoValue {
    let str_value = || GoValue::Str(text.to_owned());
    let hint = match text.bytes().next() {
        None => b'N',
        Some(b'+' | b'-') => b'S',
        Some(b'0'..=b'9') => b'D',
        Some(b'y' | b'Y' | b'n' | b'N' | b't' | b'T' | b'f' | b'F' | b'o' | b'O' | b'~') => b'M',
        Some(b'.') => b'.',
        Some(_) => return str_value(),
    };
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return GoValue::Bool(true, text.to_owned());
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return GoValue::Bool(false, text.to_owned());
        }
        "" | "~" | "null" | "Null" | "NULL" => return GoValue::Null,
        ".nan" | ".NaN" | ".NAN" => return GoValue::Float(f64::NAN, text.to_owned()),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return GoValue::Float(f64::INFINITY, text.to_owned());
        }
        "-.inf" | "-.Inf" | "-.INF" => return GoValue::Float(f64::NEG_INFINITY, text.to_owned()),
        _ => {}
    }
    match hint {
        b'.' => match parse_go_float(text) {
            Some(f) => GoValue::Float(f, text.to_owned()),
            None => str_value(),
        },
        b'D' | b'S' => {
            // Timestamps (`2001-12-14`) would be tried here; go-yaml hands them to an
            // `interface{}` as their text, and nothing that looks like one parses as a number,
            // so they end up as the string below either way.
            let plain: String = text.chars().filter(|c| *c != '_').collect();
            if let Some(i) = parse_go_int(&plain) {
                return GoValue::Int(i, text.to_owned());
            }
            if let Some(u) = parse_go_uint(&plain) {
                return GoValue::Uint(u, text.to_owned());
            }
            if let Some(f) = yaml_style_float(&plain)
                .then(|| parse_go_float(&plain))
                .flatten()
            {
                return GoValue::Float(f, text.to_owned());
            }
            // go-yaml v2's leftover binary forms: `0b` followed by what ParseInt(…, 2) takes
            // (a sign included), and `-0b…`.
            if let Some(rest) = plain.strip_prefix("0b") {
                if let Some(i) = parse_int_radix(rest, 2, true) {
                    return GoValue::Int(i, text.to_owned());
                }
                if let Some(u) = parse_uint_radix(rest, 2) {
                    return GoValue::Uint(u, text.to_owned());
                }
            } else if let Some(i) = plain
                .strip_prefix("-0b")
                .and_then(|rest| parse_int_radix(&format!("-{rest}"), 2, true))
            {
                return GoValue::Int(i, text.to_owned());
            }
            str_value()
        }
        _ => str_value(),
    }
}

/// `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, go-yaml v2's float syntax.
fn yaml_style_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// Go's `strconv.ParseFloat(s, 64)` for the decimal forms go-yaml hands it; `None` where Go
/// reports an error (syntax, or a value out of range, which go-yaml then keeps as a string).
fn parse_go_float(s: &str) -> Option<f64> {
    // Go's syntax here is a subset of Rust's, apart from the words Rust also takes ("inf",
    // "nan", "infinity"), which never reach this point (they don't start with a digit, sign or
    // dot, or they were caught by the table above).
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    if !body
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    s.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// Go's `strconv.ParseInt(s, 0, 64)`: a sign, then `0x`/`0o`/`0b`, a leading `0` for octal, or
/// decimal.
fn parse_go_int(s: &str) -> Option<i64> {
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let magnitude = parse_base0_magnitude(body)?;
    if negative {
        if magnitude <= i64::MAX as u64 + 1 {
            Some((magnitude as i64).wrapping_neg())
        } else {
            None
        }
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Go's `strconv.ParseUint(s, 0, 64)` (no sign allowed).
fn parse_go_uint(s: &str) -> Option<u64> {
    parse_base0_magnitude(s)
}

fn parse_base0_magnitude(body: &str) -> Option<u64> {
    let lower = body.get(..2).map(str::to_ascii_lowercase);
    let (digits, radix) = match lower.as_deref() {
        Some("0x") => (&body[2..], 16),
        Some("0o") => (&body[2..], 8),
        Some("0b") => (&body[2..], 2),
        _ if body.len() > 1 && body.starts_with('0') => (&body[1..], 8),
        _ => (body, 10),
    };
    parse_uint_radix(digits, radix)
}

fn parse_uint_radix(digits: &str, radix: u32) -> Option<u64> {
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// Go's `strconv.ParseInt(s, radix, 64)` with an optional sign.
fn parse_int_radix(s: &str, radix: u32, signed: bool) -> Option<i64> {
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') if signed => (true, &s[1..]),
        Some(b'+') if signed => (false, &s[1..]),
        _ => (false, s),
    };
    let magnitude = parse_uint_radix(body, radix)?;
    if negative {
        (magnitude <= i64::MAX as u64 + 1).then(|| (magnitude as i64).wrapping_neg())
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// go-yaml's quick test for its timestamp forms (four digits and a dash first); enough to tell
/// a `!!timestamp` tag on a date from one on anything else.
fn looks_like_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() > 4 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-'
}

/// `!!binary`: standard base64 (line breaks ignored, as Go's decoder does), read as text.
fn decode_base64(s: &str) -> Result<String, YamlError> {
    let err = || YamlError("!!binary value contains invalid base64 data".to_owned());
    let clean: Vec<u8> = s.bytes().filter(|b| *b != b'\n' && *b != b'\r').collect();
    if !clean.len().is_multiple_of(4) {
        return Err(err());
    }
    let sextet = |b: u8| -> Option<u32> {
        Some(match b {
            b'A'..=b'Z' => u32::from(b - b'A'),
            b'a'..=b'z' => u32::from(b - b'a') + 26,
            b'0'..=b'9' => u32::from(b - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        })
    };
    let mut out = Vec::with_capacity(clean.len() / 4 * 3);
    let chunks = clean.chunks(4).collect::<Vec<_>>();
    for (n, chunk) in chunks.iter().enumerate() {
        let pad = chunk.iter().rev().take_while(|b| **b == b'=').count();
        if pad > 2 || (pad > 0 && n + 1 != chunks.len()) {
            return Err(err());
        }
        let mut acc = 0u32;
        for &b in &chunk[..4 - pad] {
            acc = (acc << 6) | sextet(b).ok_or_else(err)?;
        }
        acc <<= 6 * pad as u32;
        let bytes = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 32)`: how `sigs.k8s.io/yaml` writes a float that goes
/// into a string (`1.0` → `1`, `1e10` → `1e+10`, `1234567.0` → `1.234567e+06`).
pub(crate) fn format_float32_g(f: f64) -> String {
    #[allow(clippy::cast_possible_truncation)] // Go converts to float32 the same way.
    let x = f as f32;
    if x.is_nan() {
        return "NaN".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0");
    }
    // Rust's `{:e}` gives the shortest digits that round-trip, like Go's shortest mode.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    let nd = digits.len() as i32;
    if !(-4..6).contains(&exp) {
        // %e: d.ddd then e±XX (at least two exponent digits).
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    } else {
        // %f with just the digits there are.
        let dp = exp + 1;
        let body = if dp <= 0 {
            format!("0.{}{}", "0".repeat((-dp) as usize), digits)
        } else if dp >= nd {
            format!("{}{}", digits, "0".repeat((dp - nd) as usize))
        } else {
            let (int, frac) = digits.split_at(dp as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> GoValue {
        match load(&format!("v: {text}\n")).unwrap() {
            GoValue::Map(mut m) => m.entries.remove("v").unwrap(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn plain_scalars_resolve_as_go_yaml_v2_does() {
        assert_eq!(one("yes"), GoValue::Bool(true, "yes".into()));
        assert_eq!(one("Off"), GoValue::Bool(false, "Off".into()));
        assert_eq!(one("yEs"), GoValue::Str("yEs".into()));
        assert_eq!(one("~"), GoValue::Null);
        assert_eq!(one(""), GoValue::Null);
        assert_eq!(one("010"), GoValue::Int(8, "010".into()));
        assert_eq!(one("0x1F"), GoValue::Int(31, "0x1F".into()));
        assert_eq!(one("0o17"), GoValue::Int(15, "0o17".into()));
        assert_eq!(one("-0b101"), GoValue::Int(-5, "-0b101".into()));
        assert_eq!(one("1_000"), GoValue::Int(1000, "1_000".into()));
        assert_eq!(one("08"), GoValue::Float(8.0, "08".into()));
        assert_eq!(one("1.0"), GoValue::Float(1.0, "1.0".into()));
        assert_eq!(one(".5"), GoValue::Float(0.5, ".5".into()));
        assert_eq!(one("1e3"), GoValue::Float(1000.0, "1e3".into()));
        assert_eq!(one("1e999"), GoValue::Str("1e999".into()));
        assert_eq!(
            one("9223372036854775808"),
            GoValue::Uint(9_223_372_036_854_775_808, "9223372036854775808".into())
        );
        assert_eq!(one("2001-12-14"), GoValue::Str("2001-12-14".into()));
        assert_eq!(one("10s"), GoValue::Str("10s".into()));
        assert_eq!(one("\"yes\""), GoValue::Str("yes".into()));
        assert_eq!(one("'010'"), GoValue::Str("010".into()));
        assert!(matches!(one(".nan"), GoValue::Float(f, _) if f.is_nan()));
        assert_eq!(
            one("-.inf"),
            GoValue::Float(f64::NEG_INFINITY, "-.inf".into())
        );
        assert_eq!(one("<<"), GoValue::Str("<<".into()));
    }

    #[test]
    fn tags_force_or_check_a_type() {
        assert_eq!(one("!!str 12"), GoValue::Str("12".into()));
        assert_eq!(one("!!int \"7\""), GoValue::Int(7, "7".into()));
        assert_eq!(one("!!float 2"), GoValue::Float(2.0, "2".into()));
        assert_eq!(one("!custom 5s"), GoValue::Str("5s".into()));
        assert_eq!(one("!!binary a2NtLXg="), GoValue::Str("kcm-x".into()));
        assert!(load("v: !!int abc\n").is_err());
        assert!(load("v: !!binary a2N\n").is_err());
    }

    #[test]
    fn keys_become_strings_and_bad_keys_are_errors() {
        let GoValue::Map(m) = load("1: a\ntrue: b\n1.5: c\n1e10: d\ny: e\n").unwrap() else {
            panic!()
        };
        let keys: Vec<_> = m.keys().map(String::as_str).collect();
        assert_eq!(keys, ["1", "1.5", "1e+10", "true"]);
        assert_eq!(m.written["true"], "y");
        assert!(!m.written.contains_key("1"));
        assert!(load("~: a\n").is_err());
        assert!(load("? [a]\n: b\n").is_err());
        assert!(load("18446744073709551615: a\n").is_err());
    }

    #[test]
    fn merge_keys_apply_at_their_position() {
        // (Not `y` as a key: YAML 1.1 reads it as the boolean true.)
        let text = "d: &d {a: 1, b: 2}\nx: {a: 9, <<: *d}\nw: {<<: *d, a: 9}\nz: {<<: [{a: 1}, {a: 2, c: 3}]}\n";
        let GoValue::Map(m) = load(text).unwrap() else {
            panic!()
        };
        let get = |k: &str, f: &str| match &m[k] {
            GoValue::Map(inner) => inner[f].clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(get("x", "a"), GoValue::Int(1, "1".into()));
        assert_eq!(get("w", "a"), GoValue::Int(9, "9".into()));
        assert_eq!(get("z", "a"), GoValue::Int(1, "1".into()));
        assert_eq!(get("z", "c"), GoValue::Int(3, "3".into()));
        assert!(load("x: {<<: 3}\n").is_err());
    }

    #[test]
    fn only_the_first_document_counts() {
        let GoValue::Map(m) = load("a: 1\n---\na: 2\n--- [\n").unwrap() else {
            panic!()
        };
        assert_eq!(m["a"], GoValue::Int(1, "1".into()));
        assert_eq!(load("").unwrap(), GoValue::Null);
        assert_eq!(load("# only a comment\n").unwrap(), GoValue::Null);
        assert_eq!(load("---\n").unwrap(), GoValue::Null);
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let err = load(&text).unwrap_err();
        assert!(err.0.contains("excessive aliasing"), "{err:?}");
    }

    #[test]
    fn aliases_of_a_big_scalar_are_refused_by_their_bytes_before_they_are_copied() {
        // One 500 KiB scalar aliased a million times: a million nodes (within the node
        // budget's reach only at the very end) but 500 GB once expanded.
        let big = "x".repeat(500 << 10);
        let mut text = format!("big: &big {big}\nmany: [");
        text.push_str(&"*big, ".repeat(1_000_000));
        text.push_str("]\n");
        let err = load(&text).unwrap_err();
        assert!(
            err.0.contains(
                "excessive aliasing (more than 16 MiB of text once aliases are expanded)"
            ),
            "{err:?}"
        );
        // The same text without the repetition is fine: the budget is not the file's size.
        assert!(load(&format!("big: &big {big}\nmany: [*big, *big, *big]\n")).is_ok());
    }

    #[test]
    fn floats_format_like_go_g_32() {
        for (f, s) in [
            (1.0, "1"),
            (0.1, "0.1"),
            (1.5, "1.5"),
            (1e10, "1e+10"),
            (1_234_567.0, "1.234567e+06"),
            (123_456.0, "123456"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (0.0, "0"),
            (-0.0, "-0"),
            (1.234_567_891_234, "1.2345679"),
            (1e300, "+Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(format_float32_g(f), s, "{f}");
        }
    }
}
