//! Splits one Kubernetes list page (`{"kind": …, "metadata": {"continue": …}, "items": […]}`)
//! into its items while the body streams in, holding one item of it at most.
//!
//! A page of real Nodes is 1-3 MiB (a hundred Nodes of 10-30 KiB each). Collected whole before
//! it is decoded, every probe run would hold one such page at a time on top of the views it
//! keeps. [`PageSplitter`] is fed the body chunk by chunk as it arrives and hands each element
//! of the top-level `items` array to its caller as soon as the element's last byte is in, as
//! that element's exact JSON text; the caller decodes it (`serde_json::from_slice`) into a slim
//! view and drops it. What the splitter holds is bounded whatever the server sends: the bytes
//! of the one item being received ([`MAX_ITEM_BYTES`] at most), the page's `metadata` while it
//! is received ([`MAX_METADATA_BYTES`] at most) and a few hundred bytes of state. Every other
//! byte (other keys' values, whitespace, items already handed over) is lexed and forgotten, and
//! an item lying whole inside one chunk is handed over from the chunk itself, never copied.
//! The callers charge [`PageSplitter::held_bytes`] to the run's memory grant.
//!
//! What it accepts is what `shoot_reads`' `PageSeed` accepts (serde_json decoding the whole
//! page from a slice):
//! - the page is one JSON object, with nothing but whitespace around it
//!   (serde_json's `Deserializer::end`);
//! - its keys are compared once unescaped (`"it\u0065ms"` is `items`) and are checked as
//!   serde_json checks a `str` key: valid UTF-8, escapes valid, surrogates paired;
//! - `items` is `null` or an array, and appears once (`duplicate field items`); its
//!   elements, whatever JSON they are, go to the caller, checked only as far as finding their
//!   end needs: the caller's decoding judges them, as the page's decoding did;
//! - `metadata` is decoded with serde_json as serde decodes it today (`Option<ListMeta>`),
//!   each time it appears, so the last one wins;
//! - any other key's value is skipped as serde's `IgnoredAny` skips it (strings checked for
//!   control characters and escapes, numbers and literals for their grammar, brackets for
//!   their pairing; no UTF-8 check), never buffered, however large.
//!
//! One difference, deliberate: nesting deeper than [`MAX_DEPTH`] levels (the page's own
//! object is the first) fails the page. serde_json skips an ignored value of any depth (its
//! `ignore_value` keeps a byte per level on the heap), so today a value nested a million
//! levels deep in an ignored field decodes; the splitter keeps a fixed bitset of bracket
//! kinds instead and refuses it. No Kubernetes object nests more than a few dozen levels, and
//! every field serde_json decodes into a typed value (all a slim view reads) already fails
//! past its recursion limit of 128 levels.
//!
//! Why hand-written: no maintained crate splits a JSON array's elements out of an async byte
//! stream with bounded memory. `serde_json::StreamDeserializer` reads a sequence of
//! concatenated JSON values, not the elements of an array inside an object, and needs its
//! input in one slice or a blocking `io::Read`. `struson` reads from a blocking `io::Read`
//! (its serde support decodes one value at a time, but only by pulling from such a reader,
//! which a hyper body is not). `actson` is push-based and non-blocking, but it yields token
//! events (field names, scalar values, array and object starts and ends) from which each item
//! would have to be rebuilt, as text or as a value, before the caller could decode it. The
//! page grammar the splitter needs is small: a byte-at-a-time state machine, with no recursion
//! (the nesting is a counter and a bitset), that copies an item's bytes in runs.

use std::convert::Infallible;

/// The longest item the callers accept: etcd stores at most 1.5 MiB a value, so no real object
/// is longer; an item longer than this fails the page.
pub(crate) const MAX_ITEM_BYTES: usize = 2 << 20;

/// The longest `metadata` value the splitter buffers: a list's metadata is a resourceVersion,
/// a `continue` token (a few hundred bytes) and a remaining item count.
pub(crate) const MAX_METADATA_BYTES: usize = 64 << 10;

/// The deepest nesting of a page, its own object being level 1; deeper fails the page (see the
/// module doc).
pub(crate) const MAX_DEPTH: usize = 256;

/// The item buffer's capacity kept from one item to the next (a Node fits): a page of Nodes
/// reuses one buffer, while one outsized item doesn't keep its megabytes for the rest of the
/// page.
const RETAINED_ITEM_BUFFER: usize = 64 << 10;

/// Bytes of a page key remembered, enough for `metadata`: a longer key is neither of the two
/// the page has, so only that it is longer is kept (its bytes are still lexed and checked).
const KEY_BYTES: usize = 16;

/// Why a page could not be split. Offsets are bytes from the start of the page.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SplitError<E> {
    /// The caller's `item` callback failed; no later item is handed over.
    #[error("the item at byte {offset} of the page: {source}")]
    Item {
        /// Where the item starts.
        offset: u64,
        /// The callback's error.
        source: E,
    },
    /// An item longer than the splitter's `max_item_bytes`.
    #[error("the item at byte {offset} of the page is longer than {limit} bytes")]
    ItemTooLarge {
        /// Where the item starts.
        offset: u64,
        /// The splitter's `max_item_bytes`.
        limit: usize,
    },
    /// A `metadata` value longer than [`MAX_METADATA_BYTES`].
    #[error("the page's metadata at byte {offset} is longer than {limit} bytes")]
    MetadataTooLarge {
        /// Where the value starts.
        offset: u64,
        /// [`MAX_METADATA_BYTES`].
        limit: usize,
    },
    /// A `metadata` value that is not a list's metadata (or `null`).
    #[error("the page's metadata at byte {offset}: {source}")]
    Metadata {
        /// Where the value starts.
        offset: u64,
        /// serde_json's error, as decoding the whole page reports it.
        source: serde_json::Error,
    },
    /// A second `items` key (however escaped).
    #[error("the page has a second `items` key, ending at byte {offset}")]
    DuplicateItems {
        /// Where the second key's closing quote is.
        offset: u64,
    },
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("the page nests deeper than {limit} levels at byte {offset}")]
    TooDeep {
        /// Where the bracket opening one level too many is.
        offset: u64,
        /// [`MAX_DEPTH`].
        limit: usize,
    },
    /// Not JSON, or not a list page (the page is not an object, `items` is neither an array
    /// nor null, something follows the page).
    #[error("the page is not a JSON list page at byte {offset}: {what}")]
    Syntax {
        /// Where the offending byte is.
        offset: u64,
        /// What was wrong there.
        what: &'static str,
    },
    /// The body ended before the page's JSON did.
    #[error("the page ends after {offset} bytes, before its JSON does")]
    Incomplete {
        /// The page's length.
        offset: u64,
    },
    /// The splitter was fed or finished after it had failed.
    #[error("the page splitter was used after it had failed")]
    Failed,
}

/// Where the lexer is: what the next byte may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the page's `{`.
    Start,
    /// After a `{`: a key or `}`.
    FirstKey,
    /// After a `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a `[`: a value or `]`.
    FirstElement,
    /// After a `:`, or a `,` in an array: a value.
    Value,
    /// Inside a string.
    String(StrRole),
    /// Inside a number (it ends at the first byte that can't continue it).
    Number(Num),
    /// Inside `true`, `false` or `null`: the bytes still to come.
    Literal(&'static [u8]),
    /// After a value: `,` or the end of its object or array.
    AfterValue,
    /// After the page's `}`: whitespace only.
    End,
    /// A feed failed; nothing more is lexed.
    Failed,
}

/// What a string is, which decides how closely it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StrRole {
    /// A key of the page's object: unescaped, validated and compared.
    PageKey,
    /// A key of a nested object: lexed only.
    Key,
    /// A string value: lexed only.
    Value,
}

/// How far a number has come (JSON's grammar, as serde_json checks it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    /// `-`: a digit must follow.
    Minus,
    /// A leading `0`: no digit may follow.
    Zero,
    /// Digits of the integer part.
    Int,
    /// `.`: a digit must follow.
    Point,
    /// Digits of the fraction.
    Fraction,
    /// `e`: a sign or digit must follow.
    Exponent,
    /// The exponent's sign: a digit must follow.
    ExponentSign,
    /// Digits of the exponent.
    ExponentDigits,
}

/// Where the lexer is within an escape sequence of a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Escape {
    /// Not in one.
    None,
    /// After a `\`.
    Backslash,
    /// In the four hex digits of a `\u`; `high` is the leading surrogate before it, when this
    /// is the trailing half of a pair (page keys only).
    Hex {
        /// The pair's leading surrogate.
        high: Option<u16>,
        /// Digits read.
        digits: u8,
        /// Their value so far.
        value: u16,
    },
    /// In a page key, after a leading surrogate: the `\` of its trailing one must follow.
    LowBackslash {
        /// The leading surrogate.
        high: u16,
    },
    /// In a page key, after a leading surrogate and `\`: the `u` must follow.
    LowU {
        /// The leading surrogate.
        high: u16,
    },
}

/// What a top-level key's value is to the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    /// Skipped.
    Other,
    /// `items`: null or the array of items.
    Items,
    /// `metadata`: buffered and decoded.
    Metadata,
}

/// Which value's bytes are being kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Capture {
    /// None.
    Off,
    /// An element of `items`, into the item buffer.
    Item,
    /// The `metadata` value, into the metadata buffer.
    Metadata,
}

/// The bytes a multi-byte UTF-8 character in a page key still needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Utf8 {
    /// Continuation bytes to come.
    need: u8,
    /// The lowest the next one may be (above 0x80 after some leading bytes, which rules out
    /// overlong forms and surrogates, as `str::from_utf8` does).
    low: u8,
    /// The highest the next one may be.
    high: u8,
}

/// The list's metadata, as `shoot_reads`' `PageSeed` decodes it.
#[derive(serde::Deserialize)]
struct ListMeta {
    /// The token of the next page.
    #[serde(rename = "continue")]
    continue_: Option<String>,
}

/// A push-based splitter of one list page's JSON into its items (see the module doc).
pub(crate) struct PageSplitter {
    /// Longer items fail the page.
    max_item_bytes: usize,
    /// Bytes of the page fed before the current chunk.
    consumed: u64,
    /// What the next byte may be.
    state: State,
    /// Open objects and arrays, the page's object included.
    depth: usize,
    /// Bit `level` set: the container open at `level` (0 being the page's) is an object.
    kinds: [u64; MAX_DEPTH / 64],
    /// What the value of the current top-level key is.
    section: Section,
    /// Whether an `items` key was seen.
    items_seen: bool,
    /// Which value's bytes are being kept.
    capture: Capture,
    /// Where the kept value starts in the current chunk; `None` when it started in an earlier
    /// one (its bytes so far are in its buffer and it continues from the chunk's start).
    capture_start: Option<usize>,
    /// Where the kept value starts in the page, for errors.
    capture_offset: u64,
    /// The item being received, when it spans chunks.
    item_buf: Vec<u8>,
    /// The `metadata` value being received, when it spans chunks.
    metadata_buf: Vec<u8>,
    /// Where the lexer is within an escape sequence.
    escape: Escape,
    /// Where the lexer is within a UTF-8 character of a page key.
    utf8: Utf8,
    /// The current page key, unescaped, up to [`KEY_BYTES`].
    key: [u8; KEY_BYTES],
    /// Bytes in `key`.
    key_len: usize,
    /// Whether the current page key is longer than [`KEY_BYTES`].
    key_long: bool,
    /// The last `metadata`'s `continue`.
    continue_token: Option<String>,
}

/// JSON's whitespace.
fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// The value of a hex digit.
fn hex_digit(b: u8) -> Option<u16> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u16::try_from(d).ok())
}

/// `chunk[start..end]`. The callers keep `start <= end <= chunk.len()` (a kept value starts at
/// a byte of the chunk, or at 0, and ends at or after it), so the empty fallback is never
/// taken; it is there so that no input can make the splitter panic.
fn span(chunk: &[u8], start: usize, end: usize) -> &[u8] {
    chunk.get(start..end).unwrap_or_default()
}

/// Appends `bytes` to `buffer` unless that makes it longer than `limit` (then `false`). The
/// capacity grows by doubling, but never past `limit`, so what a buffer holds is bounded by its
/// limit, not by twice it.
fn append_bounded(buffer: &mut Vec<u8>, bytes: &[u8], limit: usize) -> bool {
    let needed = buffer.len().saturating_add(bytes.len());
    if needed > limit {
        return false;
    }
    if needed > buffer.capacity() {
        let target = needed.max(buffer.capacity().saturating_mul(2)).min(limit);
        buffer.reserve_exact(target.saturating_sub(buffer.len()));
    }
    buffer.extend_from_slice(bytes);
    true
}

impl PageSplitter {
    /// A splitter for one page; an item longer than `max_item_bytes` fails the page (the
    /// callers pass [`MAX_ITEM_BYTES`]).
    pub(crate) fn new(max_item_bytes: usize) -> Self {
        Self {
            max_item_bytes,
            consumed: 0,
            state: State::Start,
            depth: 0,
            kinds: [0; MAX_DEPTH / 64],
            section: Section::Other,
            items_seen: false,
            capture: Capture::Off,
            capture_start: None,
            capture_offset: 0,
            item_buf: Vec::new(),
            metadata_buf: Vec::new(),
            escape: Escape::None,
            utf8: Utf8::default(),
            key: [0; KEY_BYTES],
            key_len: 0,
            key_long: false,
            continue_token: None,
        }
    }

    /// Feeds the next chunk of the body. Calls `item` once for each complete element of the
    /// top-level `items` array, in order, with exactly that element's JSON text (from its
    /// first to its last byte, no surrounding whitespace or comma). An error from `item` stops
    /// the feed and is returned. After any error the splitter is spent: it holds nothing, and
    /// feeding or finishing it again fails with [`SplitError::Failed`].
    pub(crate) fn feed<E>(
        &mut self,
        chunk: &[u8],
        mut item: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), SplitError<E>> {
        if self.state == State::Failed {
            return Err(SplitError::Failed);
        }
        let result = self
            .lex(chunk, &mut item)
            .and_then(|()| self.keep_rest(chunk));
        self.consumed = self.consumed.saturating_add(chunk.len() as u64);
        if result.is_err() {
            self.state = State::Failed;
            self.item_buf = Vec::new();
            self.metadata_buf = Vec::new();
        }
        result
    }

    /// Bytes the splitter holds now (its buffers' capacity), for the caller's memory
    /// accounting. An item or metadata value lying inside one chunk costs nothing here.
    pub(crate) fn held_bytes(&self) -> usize {
        self.item_buf.capacity()
            + self.metadata_buf.capacity()
            + self.continue_token.as_ref().map_or(0, String::capacity)
    }

    /// After the last chunk: the page's `metadata.continue` (`None` when it, or the metadata,
    /// is absent or null). Fails when the page's JSON is incomplete.
    pub(crate) fn finish(self) -> Result<Option<String>, SplitError<Infallible>> {
        match self.state {
            State::End => Ok(self.continue_token),
            State::Failed => Err(SplitError::Failed),
            _ => Err(SplitError::Incomplete {
                offset: self.consumed,
            }),
        }
    }

    /// The page offset of byte `i` of the current chunk.
    fn at(&self, i: usize) -> u64 {
        self.consumed.saturating_add(i as u64)
    }

    /// A syntax error at byte `i` of the current chunk.
    fn syntax<E>(&self, i: usize, what: &'static str) -> SplitError<E> {
        SplitError::Syntax {
            offset: self.at(i),
            what,
        }
    }

    /// Lexes all of `chunk`, handing over the items that end in it.
    fn lex<E>(
        &mut self,
        chunk: &[u8],
        item: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), SplitError<E>> {
        let mut i = 0;
        while let Some(&b) = chunk.get(i) {
            i = self.step(chunk, i, b, item)?;
        }
        Ok(())
    }

    /// Lexes from byte `i` (which is `b`); the index of the next byte to lex. That is `i`
    /// itself only where a number ended at `b` (the state has moved on, so `b` is lexed again
    /// as what follows the number), and further than `i + 1` where a string's plain bytes are
    /// skipped in one run.
    fn step<E>(
        &mut self,
        chunk: &[u8],
        i: usize,
        b: u8,
        item: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<usize, SplitError<E>> {
        match self.state {
            State::String(role) => return self.string(chunk, i, role, item),
            State::Number(num) => return self.number(chunk, i, b, num, item),
            // Whitespace inside a literal breaks it: the literal's arm below rejects it.
            State::Literal(_) => {}
            // Whitespace may stand between any two tokens.
            _ if is_whitespace(b) => return Ok(i + 1),
            _ => {}
        }
        match (self.state, b) {
            (State::Start, b'{') => {
                self.open(i, true)?;
                self.state = State::FirstKey;
            }
            (State::Start, _) => return Err(self.syntax(i, "the page is not a JSON object")),
            (State::FirstKey | State::Key, b'"') => {
                let role = if self.depth == 1 {
                    StrRole::PageKey
                } else {
                    StrRole::Key
                };
                self.begin_string(role);
            }
            (State::FirstKey, b'}') | (State::FirstElement, b']') => {
                self.close(chunk, i, b, item)?
            }
            (State::FirstKey | State::Key, _) => {
                return Err(self.syntax(i, "expected a key (a string)"));
            }
            (State::Colon, b':') => self.state = State::Value,
            (State::Colon, _) => return Err(self.syntax(i, "expected `:` after a key")),
            (State::FirstElement | State::Value, _) => self.begin_value(i, b)?,
            (State::AfterValue, b',') => {
                self.state = if self.top_is_object() {
                    State::Key
                } else {
                    State::Value
                };
            }
            (State::AfterValue, b'}' | b']') => self.close(chunk, i, b, item)?,
            (State::AfterValue, _) => {
                return Err(self.syntax(i, "expected `,` or the end of an object or array"));
            }
            (State::Literal(rest), _) => match rest.split_first() {
                Some((&want, rest)) if want == b => {
                    if rest.is_empty() {
                        self.value_done(chunk, i + 1, item)?;
                    } else {
                        self.state = State::Literal(rest);
                    }
                }
                _ => return Err(self.syntax(i, "invalid literal (not true, false or null)")),
            },
            (State::End, _) => return Err(self.syntax(i, "trailing characters after the page")),
            // Handled above, or never lexed.
            (State::String(_) | State::Number(_) | State::Failed, _) => {}
        }
        Ok(i + 1)
    }

    /// Starts the value whose first byte is `b`, at byte `i`.
    fn begin_value<E>(&mut self, i: usize, b: u8) -> Result<(), SplitError<E>> {
        match (self.depth, self.section) {
            // serde's `deserialize_option` then `deserialize_seq`: null or an array.
            (1, Section::Items) if b != b'[' && b != b'n' => {
                return Err(self.syntax(i, "`items` is neither an array nor null"));
            }
            (1, Section::Metadata) => self.start_capture(Capture::Metadata, i),
            // Inside the items array (the only container at level 2 while `items` is read).
            (2, Section::Items) => self.start_capture(Capture::Item, i),
            _ => {}
        }
        self.state = match b {
            b'{' => {
                self.open(i, true)?;
                State::FirstKey
            }
            b'[' => {
                self.open(i, false)?;
                State::FirstElement
            }
            b'"' => {
                self.begin_string(StrRole::Value);
                return Ok(());
            }
            b'-' => State::Number(Num::Minus),
            b'0' => State::Number(Num::Zero),
            b'1'..=b'9' => State::Number(Num::Int),
            b't' => State::Literal(b"rue"),
            b'f' => State::Literal(b"alse"),
            b'n' => State::Literal(b"ull"),
            _ => return Err(self.syntax(i, "expected a value")),
        };
        Ok(())
    }

    /// Opens an object (or an array) at byte `i`.
    fn open<E>(&mut self, i: usize, object: bool) -> Result<(), SplitError<E>> {
        if self.depth >= MAX_DEPTH {
            return Err(SplitError::TooDeep {
                offset: self.at(i),
                limit: MAX_DEPTH,
            });
        }
        if let Some(word) = self.kinds.get_mut(self.depth / 64) {
            let bit = 1u64 << (self.depth % 64);
            if object {
                *word |= bit;
            } else {
                *word &= !bit;
            }
        }
        self.depth += 1;
        Ok(())
    }

    /// Whether the innermost open container is an object.
    fn top_is_object(&self) -> bool {
        self.depth.checked_sub(1).is_some_and(|level| {
            self.kinds
                .get(level / 64)
                .is_some_and(|word| word & (1u64 << (level % 64)) != 0)
        })
    }

    /// Closes the innermost container with `b` (`}` or `]`) at byte `i`.
    fn close<E>(
        &mut self,
        chunk: &[u8],
        i: usize,
        b: u8,
        item: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), SplitError<E>> {
        if self.top_is_object() != (b == b'}') {
            return Err(self.syntax(i, "mismatched bracket"));
        }
        self.depth = self.depth.saturating_sub(1);
        self.value_done(chunk, i + 1, item)
    }

    /// A value ended just before byte `end` of the chunk (exclusive, `0` when it ended with
    /// the previous chunk): hands it over if it is an item, decodes it if it is the metadata.
    fn value_done<E>(
        &mut self,
        chunk: &[u8],
        end: usize,
        item: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), SplitError<E>> {
        self.state = State::AfterValue;
        match self.depth {
            0 => self.state = State::End,
            1 => {
                if self.capture == Capture::Metadata {
                    self.metadata_done(chunk, end)?;
                }
                self.section = Section::Other;
            }
            2 if self.capture == Capture::Item => self.item_done(chunk, end, item)?,
            _ => {}
        }
        Ok(())
    }

    /// Starts keeping the bytes of the value starting at byte `i`.
    fn start_capture(&mut self, capture: Capture, i: usize) {
        self.capture = capture;
        self.capture_start = Some(i);
        self.capture_offset = self.at(i);
    }

    /// At the end of a chunk: moves the kept value's bytes in it to its buffer (in one run).
    fn keep_rest<E>(&mut self, chunk: &[u8]) -> Result<(), SplitError<E>> {
        let rest = span(chunk, self.capture_start.take().unwrap_or(0), chunk.len());
        match self.capture {
            Capture::Off => {}
            Capture::Item => {
                if !append_bounded(&mut self.item_buf, rest, self.max_item_bytes) {
                    return Err(SplitError::ItemTooLarge {
                        offset: self.capture_offset,
                        limit: self.max_item_bytes,
                    });
                }
            }
            Capture::Metadata => {
                if !append_bounded(&mut self.metadata_buf, rest, MAX_METADATA_BYTES) {
                    return Err(SplitError::MetadataTooLarge {
                        offset: self.capture_offset,
                        limit: MAX_METADATA_BYTES,
                    });
                }
            }
        }
        Ok(())
    }

    /// An item ended before byte `end`: hands it to `item`, from the chunk when it lies inside
    /// it, else from the item buffer.
    fn item_done<E>(
        &mut self,
        chunk: &[u8],
        end: usize,
        item: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), SplitError<E>> {
        self.capture = Capture::Off;
        let offset = self.capture_offset;
        let too_large = SplitError::ItemTooLarge {
            offset,
            limit: self.max_item_bytes,
        };
        let handed = match self.capture_start.take() {
            Some(start) => {
                let bytes = span(chunk, start, end);
                if bytes.len() > self.max_item_bytes {
                    return Err(too_large);
                }
                item(bytes)
            }
            None => {
                if !append_bounded(&mut self.item_buf, span(chunk, 0, end), self.max_item_bytes) {
                    return Err(too_large);
                }
                let handed = item(&self.item_buf);
                self.item_buf.clear();
                if self.item_buf.capacity() > RETAINED_ITEM_BUFFER {
                    self.item_buf = Vec::new();
                }
                handed
            }
        };
        handed.map_err(|source| SplitError::Item { offset, source })
    }

    /// The `metadata` value ended before byte `end`: decodes its `continue`, replacing an
    /// earlier one's (serde's visitor assigns it each time).
    fn metadata_done<E>(&mut self, chunk: &[u8], end: usize) -> Result<(), SplitError<E>> {
        self.capture = Capture::Off;
        let offset = self.capture_offset;
        let decoded = match self.capture_start.take() {
            Some(start) => {
                let bytes = span(chunk, start, end);
                if bytes.len() > MAX_METADATA_BYTES {
                    return Err(SplitError::MetadataTooLarge {
                        offset,
                        limit: MAX_METADATA_BYTES,
                    });
                }
                serde_json::from_slice::<Option<ListMeta>>(bytes)
            }
            None => {
                if !append_bounded(
                    &mut self.metadata_buf,
                    span(chunk, 0, end),
                    MAX_METADATA_BYTES,
                ) {
                    return Err(SplitError::MetadataTooLarge {
                        offset,
                        limit: MAX_METADATA_BYTES,
                    });
                }
                let decoded = serde_json::from_slice::<Option<ListMeta>>(&self.metadata_buf);
                // A page has one metadata: its buffer is not kept for another.
                self.metadata_buf = Vec::new();
                decoded
            }
        };
        let metadata = decoded.map_err(|source| SplitError::Metadata { offset, source })?;
        self.continue_token = metadata.and_then(|m| m.continue_);
        Ok(())
    }

    /// Lexes a number's byte `b` at `i`; the index of the next byte to lex.
    fn number<E>(
        &mut self,
        chunk: &[u8],
        i: usize,
        b: u8,
        num: Num,
        item: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<usize, SplitError<E>> {
        let next = match (num, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus | Num::Int, b'0'..=b'9') => Num::Int,
            (Num::Zero, b'0'..=b'9') => {
                return Err(self.syntax(i, "invalid number (a leading zero)"));
            }
            (Num::Zero | Num::Int, b'.') => Num::Point,
            (Num::Point | Num::Fraction, b'0'..=b'9') => Num::Fraction,
            (Num::Zero | Num::Int | Num::Fraction, b'e' | b'E') => Num::Exponent,
            (Num::Exponent, b'+' | b'-') => Num::ExponentSign,
            (Num::Exponent | Num::ExponentSign | Num::ExponentDigits, b'0'..=b'9') => {
                Num::ExponentDigits
            }
            (Num::Minus | Num::Point | Num::Exponent | Num::ExponentSign, _) => {
                return Err(self.syntax(i, "invalid number (a digit must follow)"));
            }
            (Num::Zero | Num::Int | Num::Fraction | Num::ExponentDigits, _) => {
                // The number ended before `b`, which is lexed again as what follows it.
                self.value_done(chunk, i, item)?;
                return Ok(i);
            }
        };
        self.state = State::Number(next);
        Ok(i + 1)
    }

    /// Starts a string (its opening quote was just lexed).
    fn begin_string(&mut self, role: StrRole) {
        self.state = State::String(role);
        self.escape = Escape::None;
        self.utf8 = Utf8::default();
        self.key_len = 0;
        self.key_long = false;
    }

    /// Lexes a string from byte `i`; the index of the next byte to lex.
    fn string<E>(
        &mut self,
        chunk: &[u8],
        mut i: usize,
        role: StrRole,
        item: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<usize, SplitError<E>> {
        while let Some(&b) = chunk.get(i) {
            if self.escape != Escape::None {
                self.escape_byte(i, b, role == StrRole::PageKey)?;
                i += 1;
                continue;
            }
            if role == StrRole::PageKey {
                if self.page_key_byte(i, b)? {
                    self.page_key_done(i)?;
                    return Ok(i + 1);
                }
                i += 1;
                continue;
            }
            // Any other string is skipped in runs of plain bytes, as serde_json's
            // `ignore_str` skips them (no UTF-8 check).
            let run = span(chunk, i, chunk.len())
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20);
            let Some(run) = run else {
                return Ok(chunk.len());
            };
            i += run;
            match chunk.get(i) {
                Some(b'"') => {
                    if role == StrRole::Value {
                        self.value_done(chunk, i + 1, item)?;
                    } else {
                        self.state = State::Colon;
                    }
                    return Ok(i + 1);
                }
                Some(b'\\') => {
                    self.escape = Escape::Backslash;
                    i += 1;
                }
                _ => return Err(self.syntax(i, "a control character in a string")),
            }
        }
        Ok(i)
    }

    /// Lexes byte `b` (at `i`) of an escape sequence; in a page `key`, decodes it into the key
    /// as serde_json does (`\u` surrogates must pair up).
    fn escape_byte<E>(&mut self, i: usize, b: u8, key: bool) -> Result<(), SplitError<E>> {
        self.escape = match self.escape {
            Escape::None => Escape::None,
            Escape::Backslash => {
                let unescaped = match b {
                    b'"' | b'\\' | b'/' => b,
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.escape = Escape::Hex {
                            high: None,
                            digits: 0,
                            value: 0,
                        };
                        return Ok(());
                    }
                    _ => return Err(self.syntax(i, "invalid escape in a string")),
                };
                if key {
                    self.push_key(unescaped);
                }
                Escape::None
            }
            Escape::Hex {
                high,
                digits,
                value,
            } => {
                let Some(digit) = hex_digit(b) else {
                    return Err(self.syntax(i, "invalid \\u escape in a string"));
                };
                let value = value << 4 | digit;
                match (digits + 1, key) {
                    (4, true) => self.unicode_escape(i, high, value)?,
                    (4, false) => Escape::None,
                    (digits, _) => Escape::Hex {
                        high,
                        digits,
                        value,
                    },
                }
            }
            Escape::LowBackslash { high } if b == b'\\' => Escape::LowU { high },
            Escape::LowU { high } if b == b'u' => Escape::Hex {
                high: Some(high),
                digits: 0,
                value: 0,
            },
            Escape::LowBackslash { .. } | Escape::LowU { .. } => {
                return Err(self.syntax(i, "a lone leading surrogate in a key's \\u escape"));
            }
        };
        Ok(())
    }

    /// A page key's complete `\u` escape of `value` (after the leading surrogate `high`, when
    /// it is a pair's trailing half), checked and decoded as serde_json decodes a `str`.
    fn unicode_escape<E>(
        &mut self,
        i: usize,
        high: Option<u16>,
        value: u16,
    ) -> Result<Escape, SplitError<E>> {
        let code = match high {
            None => match value {
                0xD800..=0xDBFF => return Ok(Escape::LowBackslash { high: value }),
                0xDC00..=0xDFFF => {
                    return Err(self.syntax(i, "a lone trailing surrogate in a key's \\u escape"));
                }
                _ => u32::from(value),
            },
            // `high` is a leading surrogate (0xD800..=0xDBFF), `value` a trailing one.
            Some(high) => match value {
                0xDC00..=0xDFFF => {
                    0x1_0000
                        + ((u32::from(high).saturating_sub(0xD800) << 10)
                            | (u32::from(value) - 0xDC00))
                }
                _ => return Err(self.syntax(i, "a lone leading surrogate in a key's \\u escape")),
            },
        };
        let Some(c) = char::from_u32(code) else {
            return Err(self.syntax(i, "an invalid \\u escape in a key"));
        };
        let mut utf8 = [0; 4];
        for &byte in c.encode_utf8(&mut utf8).as_bytes() {
            self.push_key(byte);
        }
        Ok(Escape::None)
    }

    /// Lexes byte `b` (at `i`, not in an escape) of a page key, checking its UTF-8 as
    /// `str::from_utf8` does; whether it is the closing quote.
    fn page_key_byte<E>(&mut self, i: usize, b: u8) -> Result<bool, SplitError<E>> {
        let invalid = |s: &Self| s.syntax(i, "invalid UTF-8 in a key");
        if self.utf8.need > 0 {
            if !(self.utf8.low..=self.utf8.high).contains(&b) {
                return Err(invalid(self));
            }
            self.utf8 = Utf8 {
                need: self.utf8.need - 1,
                low: 0x80,
                high: 0xBF,
            };
            self.push_key(b);
            return Ok(false);
        }
        let (need, low, high) = match b {
            b'"' => return Ok(true),
            b'\\' => {
                self.escape = Escape::Backslash;
                return Ok(false);
            }
            0x00..=0x1F => return Err(self.syntax(i, "a control character in a string")),
            0x20..=0x7F => (0, 0x80, 0xBF),
            0xC2..=0xDF => (1, 0x80, 0xBF),
            0xE0 => (2, 0xA0, 0xBF),
            0xE1..=0xEC | 0xEE..=0xEF => (2, 0x80, 0xBF),
            0xED => (2, 0x80, 0x9F),
            0xF0 => (3, 0x90, 0xBF),
            0xF1..=0xF3 => (3, 0x80, 0xBF),
            0xF4 => (3, 0x80, 0x8F),
            _ => return Err(invalid(self)),
        };
        self.utf8 = Utf8 { need, low, high };
        self.push_key(b);
        Ok(false)
    }

    /// Appends an unescaped byte to the current page key, or notes it is too long to matter.
    fn push_key(&mut self, b: u8) {
        match self.key.get_mut(self.key_len) {
            Some(slot) => {
                *slot = b;
                self.key_len += 1;
            }
            None => self.key_long = true,
        }
    }

    /// A page key ended with the quote at byte `i`: what its value is to the page.
    fn page_key_done<E>(&mut self, i: usize) -> Result<(), SplitError<E>> {
        let key = if self.key_long {
            None
        } else {
            self.key.get(..self.key_len)
        };
        self.section = match key {
            Some(b"items") => {
                if self.items_seen {
                    return Err(SplitError::DuplicateItems { offset: self.at(i) });
                }
                self.items_seen = true;
                Section::Items
            }
            Some(b"metadata") => Section::Metadata,
            _ => Section::Other,
        };
        self.state = State::Colon;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::fmt;
    use std::time::Instant;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use serde::Deserializer as _;
    use serde::de::{self, IgnoredAny, MapAccess, Visitor};
    use serde_json::Value;

    use super::*;

    /// What a page yields: its items (as values) and its `continue` token.
    type Split = (Vec<Value>, Option<String>);

    /// The splitter's errors, its `finish`'s included, with the items' decoding errors.
    type Error = SplitError<serde_json::Error>;

    /// Today's decoding of a page (`shoot_reads`' `PageSeed`, with `Value` items), the
    /// oracle: a page the splitter must split into the same items and token, or reject.
    fn reference(page: &[u8]) -> Result<Split, serde_json::Error> {
        /// `PageSeed`'s visitor, collecting values.
        struct Page;
        impl<'de> Visitor<'de> for Page {
            type Value = Split;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list page")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Split, A::Error> {
                let mut token = None;
                let mut items: Option<Vec<Value>> = None;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match key.as_ref() {
                        "metadata" => {
                            token = map
                                .next_value::<Option<ListMeta>>()?
                                .and_then(|m| m.continue_);
                        }
                        "items" if items.is_some() => {
                            return Err(de::Error::duplicate_field("items"));
                        }
                        "items" => {
                            items =
                                Some(map.next_value::<Option<Vec<Value>>>()?.unwrap_or_default());
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok((items.unwrap_or_default(), token))
            }
        }
        let mut decoder = serde_json::Deserializer::from_slice(page);
        let split = decoder.deserialize_map(Page)?;
        decoder.end()?;
        Ok(split)
    }

    /// `finish`'s error as a feed's.
    fn widen(e: SplitError<Infallible>) -> Error {
        match e {
            SplitError::Item { source, .. } => match source {},
            SplitError::ItemTooLarge { offset, limit } => {
                SplitError::ItemTooLarge { offset, limit }
            }
            SplitError::MetadataTooLarge { offset, limit } => {
                SplitError::MetadataTooLarge { offset, limit }
            }
            SplitError::Metadata { offset, source } => SplitError::Metadata { offset, source },
            SplitError::DuplicateItems { offset } => SplitError::DuplicateItems { offset },
            SplitError::TooDeep { offset, limit } => SplitError::TooDeep { offset, limit },
            SplitError::Syntax { offset, what } => SplitError::Syntax { offset, what },
            SplitError::Incomplete { offset } => SplitError::Incomplete { offset },
            SplitError::Failed => SplitError::Failed,
        }
    }

    /// Splits `page` fed in chunks of the sizes `next_size` gives (0 feeds an empty chunk),
    /// each item decoded as a `Value`; also the most the splitter held between feeds.
    fn split_sized(
        page: &[u8],
        max_item_bytes: usize,
        mut next_size: impl FnMut() -> usize,
    ) -> (Result<Split, Error>, usize) {
        let mut splitter = PageSplitter::new(max_item_bytes);
        let mut items = Vec::new();
        let mut held = 0;
        let mut rest = page;
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(next_size().min(rest.len()));
            let fed = splitter.feed(chunk, |bytes| {
                serde_json::from_slice::<Value>(bytes).map(|v| items.push(v))
            });
            held = held.max(splitter.held_bytes());
            if let Err(e) = fed {
                return (Err(e), held);
            }
            rest = tail;
        }
        let token = splitter.finish().map_err(widen);
        (token.map(|token| (items, token)), held)
    }

    /// Splits `page` fed in chunks of `size` bytes.
    fn split_by(page: &[u8], size: usize) -> Result<Split, Error> {
        split_sized(page, MAX_ITEM_BYTES, || size).0
    }

    /// Splits `page` fed whole.
    fn split(page: &[u8]) -> Result<Split, Error> {
        split_by(page, page.len().max(1))
    }

    /// The exact bytes of each item of `page` fed in chunks of `size` bytes.
    fn item_bytes(page: &[u8], size: usize) -> Vec<Vec<u8>> {
        let mut splitter = PageSplitter::new(MAX_ITEM_BYTES);
        let mut items = Vec::new();
        for chunk in page.chunks(size) {
            splitter
                .feed(chunk, |bytes| {
                    items.push(bytes.to_vec());
                    Ok::<_, Infallible>(())
                })
                .unwrap();
        }
        splitter.finish().unwrap();
        items
    }

    /// Asserts the splitter and today's decoding agree on `page` split as `split` says: the
    /// same items and token, or both reject it.
    fn assert_agree(page: &[u8], split: Result<Split, Error>) {
        match (reference(page), split) {
            (Ok(want), Ok(got)) => assert_eq!(got, want, "{}", String::from_utf8_lossy(page)),
            (Err(_), Err(_)) => {}
            (want, got) => panic!(
                "serde: {want:?}, splitter: {got:?}, page: {}",
                String::from_utf8_lossy(page)
            ),
        }
    }

    /// A page of three Node-like items whose strings hold brackets, escaped quotes and
    /// backslashes, unicode escapes and raw UTF-8, with numbers and nulls of every shape.
    const NODES: &[u8] = br#"{
  "kind": "NodeList", "apiVersion": "v1",
  "metadata": {"resourceVersion": "12345", "continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIzNDV9"},
  "items": [
    {"metadata": {"name": "node-a", "uid": "0f6e-\u00e9\u4e2d\ud83d\ude00",
      "labels": {"topology.kubernetes.io/zone": "eu-1a", "odd{[": "}]\"\\", "": null},
      "annotations": {"note": "a \"quoted\" {json} [text] \\ with \/ slash \b\f\n\r\t"}},
     "spec": {"providerID": "aws:///eu-1a/i-0abc", "taints": [], "unschedulable": false},
     "status": {"capacity": {"cpu": "4", "memory": "16Gi"},
       "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2024-01-01T00:00:00Z"}],
       "images": [{"names": ["reg/x@sha256:ab", "reg/x:1"], "sizeBytes": 123456789}],
       "numbers": [0, -0, 1.5, -2.25e-3, 6E+2, 7e9, 12345678901234567890, -9.5E-10, 0.0]}},
    {"metadata": {"name": "node-b", "deletionTimestamp": null}, "spec": {}, "status": {"conditions": [[], [[]], {}], "x": true}},
    {"metadata":{"name":"node-c","labels":{"k":"v]}"}},"status":{"addresses":[{"type":"InternalIP","address":"10.0.0.3"}]}}
  ]
}
"#;

    /// The realistic page's items, exactly as `serde_json` reads the page.
    fn nodes_reference() -> Split {
        let split = reference(NODES).unwrap();
        assert_eq!(split.0.len(), 3);
        assert_eq!(
            split.1.as_deref(),
            Some("eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIzNDV9")
        );
        split
    }

    #[test]
    fn a_realistic_page_splits_the_same_whole_in_every_chunk_size_and_at_every_byte() {
        let want = nodes_reference();
        assert_eq!(split(NODES).unwrap(), want);
        for size in 1..=64 {
            assert_eq!(split_by(NODES, size).unwrap(), want, "chunks of {size}");
        }
        for at in 0..=NODES.len() {
            let (first, second) = NODES.split_at(at);
            let mut sizes = [first.len(), second.len()].into_iter();
            let (got, _) = split_sized(NODES, MAX_ITEM_BYTES, || sizes.next().unwrap_or(1));
            assert_eq!(got.unwrap(), want, "split at {at}");
        }
    }

    #[test]
    fn items_are_handed_over_as_their_exact_text_in_every_chunk_size() {
        let page = br#"{"items":[ 1 ,{"a" : [2, "]"]}
, "x\"" ,-0.5e+3,true, null,[ ] ]}"#;
        let want: Vec<&[u8]> = vec![
            b"1",
            b"{\"a\" : [2, \"]\"]}",
            b"\"x\\\"\"",
            b"-0.5e+3",
            b"true",
            b"null",
            b"[ ]",
        ];
        for size in 1..=page.len() {
            assert_eq!(item_bytes(page, size), want, "chunks of {size}");
        }
    }

    #[test]
    fn an_item_inside_one_chunk_is_not_copied_and_a_split_one_costs_about_its_size() {
        let (got, held) = split_sized(NODES, MAX_ITEM_BYTES, || NODES.len());
        assert_eq!(got.unwrap(), nodes_reference());
        // Only the continue token: the items and the metadata were read from the chunk.
        assert!(held <= 64, "held {held} bytes");
        let longest = NODES.len() / 2;
        let (got, held) = split_sized(NODES, MAX_ITEM_BYTES, || 1);
        assert_eq!(got.unwrap(), nodes_reference());
        assert!(held > 0 && held <= 2 * longest, "held {held} bytes");
    }

    #[test]
    fn the_layouts_a_server_may_send_split_as_serde_decodes_them() {
        let big_string = format!("\"{}\"", "ab\\\"{[".repeat(50_000));
        let big_nested = format!("{}0{}", "[{\"k\":".repeat(50), "}]".repeat(50));
        let cases: Vec<(String, usize, Option<&str>)> = vec![
            (r#"{"items":[{},{}],"metadata":{"continue":"c"}}"#.into(), 2, Some("c")),
            (r#"{"metadata":{"continue":"c"},"items":[{}]}"#.into(), 1, Some("c")),
            (r#"{"items":[{}]}"#.into(), 1, None),
            (r#"{"metadata":null,"items":[{}]}"#.into(), 1, None),
            (r#"{"metadata":{"continue":null}}"#.into(), 0, None),
            (r#"{"metadata":{},"items":null}"#.into(), 0, None),
            (r#"{"items":[]}"#.into(), 0, None),
            (r#"{}"#.into(), 0, None),
            // Keys compared unescaped, the page's and the metadata's.
            (r#"{"it\u0065ms":[1,2],"meta\u0064\u0061ta":{"\u0063ontinue":"e"}}"#.into(), 2, Some("e")),
            (r#"{"\u0069\u0074\u0065\u006d\u0073":[{}]}"#.into(), 1, None),
            // Near misses are other keys.
            (r#"{"item":[{}],"itemss":[{}],"Items":[1],"metadata ":{"continue":"x"}}"#.into(), 0, None),
            // A later metadata replaces an earlier one, null included.
            (r#"{"metadata":{"continue":"a"},"metadata":{"continue":"b"}}"#.into(), 0, Some("b")),
            (r#"{"metadata":{"continue":"a"},"metadata":null}"#.into(), 0, None),
            // Other keys' values, however large or nested, are skipped.
            (format!(r#"{{"big":{big_string},"items":[{{}}],"deep":{big_nested},"metadata":{{"continue":"d"}}}}"#), 1, Some("d")),
            (format!(r#"{{"kind":{big_nested},"items":[{big_nested}]}}"#), 1, None),
            // Whitespace wherever JSON allows it.
            (" \n\t{ \r\"items\" \n: \t[ \n{ \"a\" : [ 1 , 2 ] } , \n null ] , \"metadata\" : { \"continue\" : \"w\" } } \n \t".into(), 2, Some("w")),
        ];
        for (page, items, token) in cases {
            let page = page.as_bytes();
            let want = reference(page).unwrap();
            assert_eq!(want.0.len(), items);
            assert_eq!(want.1.as_deref(), token);
            assert_eq!(split(page).unwrap(), want);
            for size in [1, 2, 3, 7, 4096] {
                let (got, held) = split_sized(page, MAX_ITEM_BYTES, || size);
                assert_eq!(got.unwrap(), want);
                // The big values were skipped, not kept.
                assert!(held < 16 << 10, "held {held} bytes");
            }
        }
    }

    #[test]
    fn what_is_not_a_list_page_fails_it() {
        for page in ["[]", "\"x\"", "1", "null", " true", "x"] {
            assert!(
                matches!(split(page.as_bytes()), Err(SplitError::Syntax { .. })),
                "{page}"
            );
            assert!(reference(page.as_bytes()).is_err());
        }
        for page in ["", "  \n"] {
            assert!(matches!(
                split(page.as_bytes()),
                Err(SplitError::Incomplete { .. })
            ));
        }
        for page in ["{}x", "{} {}", "{}}", "{}]", "{\"items\":[]} ,"] {
            let got = split(page.as_bytes());
            assert!(
                matches!(got, Err(SplitError::Syntax { .. })),
                "{page}: {got:?}"
            );
            assert!(reference(page.as_bytes()).is_err());
        }
        assert_eq!(split(b"{} \n\t\r").unwrap(), (vec![], None));
    }

    #[test]
    fn every_proper_prefix_of_a_page_is_incomplete() {
        for end in 0..NODES.len() {
            let prefix = NODES.get(..end).unwrap();
            let trimmed = prefix.trim_ascii_end();
            let whole = trimmed.ends_with(b"}") && reference(prefix).is_ok();
            match split(prefix) {
                Ok(_) => assert!(whole, "prefix of {end} bytes"),
                Err(SplitError::Incomplete { offset }) => assert_eq!(offset, end as u64),
                Err(e) => panic!("prefix of {end} bytes: {e}"),
            }
            assert!(split_by(prefix, 5).is_err() || whole);
        }
    }

    #[test]
    fn a_page_whose_items_are_not_a_list_fails() {
        for page in [
            r#"{"items":1}"#,
            r#"{"items":"[]"}"#,
            r#"{"items":{}}"#,
            r#"{"items":true}"#,
            r#"{"items":nul}"#,
        ] {
            let got = split(page.as_bytes());
            assert!(
                matches!(got, Err(SplitError::Syntax { .. })),
                "{page}: {got:?}"
            );
            assert!(reference(page.as_bytes()).is_err());
        }
        for page in [
            r#"{"items":[],"items":[]}"#,
            r#"{"items":null,"it\u0065ms":[1]}"#,
        ] {
            let got = split(page.as_bytes());
            assert!(
                matches!(got, Err(SplitError::DuplicateItems { .. })),
                "{page}: {got:?}"
            );
            assert!(reference(page.as_bytes()).is_err());
        }
    }

    #[test]
    fn broken_json_inside_an_item_fails_the_page() {
        for page in [
            r#"{"items":[{"a":[}]}"#,
            r#"{"items":[{"a":1]]}"#,
            r#"{"items":[[}]}"#,
            r#"{"items":[1,]}"#,
            r#"{"items":[01]}"#,
            r#"{"items":[-]}"#,
            r#"{"items":[1.]}"#,
            r#"{"items":[1e]}"#,
            r#"{"items":[tru]}"#,
            r#"{"items":["\x"]}"#,
            r#"{"items":["\u12g4"]}"#,
            "{\"items\":[\"a\u{1}b\"]}",
            r#"{"items":[{"a" 1}]}"#,
            r#"{"items":[{1:1}]}"#,
        ] {
            let page = page.as_bytes();
            for size in [1, page.len()] {
                let got = split_by(page, size);
                assert!(
                    matches!(got, Err(SplitError::Syntax { .. })),
                    "{page:?}: {got:?}"
                );
            }
            assert!(reference(page).is_err());
        }
    }

    #[test]
    fn an_unterminated_string_is_incomplete() {
        for page in [r#"{"items":["abc"#, r#"{"a"#, r#"{"a":"\"#, r#"{"a":"\u12"#] {
            assert!(matches!(
                split(page.as_bytes()),
                Err(SplitError::Incomplete { .. })
            ));
        }
    }

    #[test]
    fn an_item_longer_than_the_limit_fails_the_page_however_it_is_chunked() {
        let page = br#"{"items":["01234567", "0123456789", "never"]}"#;
        for size in [1, 3, page.len()] {
            let (got, held) = split_sized(page, 10, || size);
            match got {
                Err(SplitError::ItemTooLarge { offset, limit }) => {
                    assert_eq!((offset, limit), (22, 10), "chunks of {size}");
                }
                other => panic!("chunks of {size}: {other:?}"),
            }
            assert!(held <= 10, "held {held} bytes");
        }
        // Ten bytes is not too long.
        assert_eq!(
            split_sized(br#"{"items":["01234567"]}"#, 10, || 1)
                .0
                .unwrap()
                .0
                .len(),
            1
        );
    }

    #[test]
    fn metadata_longer_than_its_bound_or_not_metadata_fails_the_page() {
        let long = format!(
            r#"{{"metadata":{{"continue":"{}"}},"items":[]}}"#,
            "x".repeat(MAX_METADATA_BYTES)
        );
        for size in [1000, long.len()] {
            let (got, held) = split_sized(long.as_bytes(), MAX_ITEM_BYTES, || size);
            assert!(
                matches!(got, Err(SplitError::MetadataTooLarge { offset: 12, .. })),
                "{got:?}"
            );
            assert!(held <= MAX_METADATA_BYTES);
        }
        for page in [
            r#"{"metadata":5}"#,
            r#"{"metadata":{"continue":1}}"#,
            r#"{"metadata":{"continue":"a","continue":"b"}}"#,
        ] {
            let got = split(page.as_bytes());
            assert!(
                matches!(got, Err(SplitError::Metadata { .. })),
                "{page}: {got:?}"
            );
            assert!(reference(page.as_bytes()).is_err());
        }
    }

    #[test]
    fn nesting_is_capped_without_recursion() {
        /// A page nesting `levels` deep (its own object included) in an ignored key.
        fn nested(levels: usize) -> Vec<u8> {
            let arrays = levels - 1;
            format!("{{\"x\":{}{}}}", "[".repeat(arrays), "]".repeat(arrays)).into_bytes()
        }
        assert_eq!(split(&nested(MAX_DEPTH)).unwrap(), (vec![], None));
        assert!(matches!(
            split(&nested(MAX_DEPTH + 1)),
            Err(SplitError::TooDeep { offset, limit: MAX_DEPTH }) if offset == MAX_DEPTH as u64 + 4
        ));
        // A million levels: no stack, no heap per level, just the error.
        let hostile = format!("{{\"items\":[{}", "[".repeat(1_000_000));
        assert!(matches!(
            split(hostile.as_bytes()),
            Err(SplitError::TooDeep { .. })
        ));
        let hostile = format!("{{\"x\":{}", "{\"a\":".repeat(1_000_000));
        assert!(matches!(
            split_by(hostile.as_bytes(), 4096),
            Err(SplitError::TooDeep { .. })
        ));
    }

    #[test]
    fn page_keys_are_checked_as_serde_checks_them_and_other_strings_as_it_skips_them() {
        let cases: &[&[u8]] = &[
            b"{\"\xff\":1}",
            b"{\"a\xc3\":1}",
            b"{\"\xc3\xa9\":1}",
            b"{\"\xed\xa0\x80\":1}",
            b"{\"\xf0\x9f\x98\x80\":1}",
            b"{\"\xc0\xaf\":1}",
            b"{\"\xc3\\u00e9\":1}",
            br#"{"\ud800":1}"#,
            br#"{"\udc00":1}"#,
            br#"{"\ud83d\ude00":1}"#,
            br#"{"\ud83d\u0041":1}"#,
            br#"{"\ud83d\n":1}"#,
            br#"{"\ud83dx":1}"#,
            br#"{"\ud83d\ud83d\ude00":1}"#,
            br#"{"x":"\ud800"}"#,
            br#"{"x":{"\ud800":"\udc00"}}"#,
            b"{\"x\":\"\xff\"}",
            b"{\"x\":{\"\xff\":1}}",
            b"{\"items\":[\"\xff\"]}",
            br#"{"items":["\ud800"]}"#,
            br#"{"metadata":{"continue":"\ud800"}}"#,
            b"{\"metadata\":{\"continue\":\"\xff\"}}",
            b"{\"meta\\u0064ata\":{\"continue\":\"\xc3\xa9\"}}",
            br#"{"\u0000":1,"\"\\\/\b\f\n\r\t":2}"#,
            b"{\"a\x1f\":1}",
            b"{\"x\":\"\x7f\"}",
        ];
        for page in cases {
            for size in [1, 2, page.len()] {
                assert_agree(page, split_by(page, size));
            }
        }
    }

    #[test]
    fn an_error_from_the_callback_stops_the_feed_and_spends_the_splitter() {
        let page = br#"{"items":[{"n":1},{"n":2},{"n":3}]}"#;
        let mut splitter = PageSplitter::new(MAX_ITEM_BYTES);
        let mut calls = 0;
        let got = splitter.feed(page, |bytes| {
            calls += 1;
            if bytes == br#"{"n":2}"# {
                Err("no")
            } else {
                Ok(())
            }
        });
        assert_eq!(calls, 2);
        assert!(matches!(
            got,
            Err(SplitError::Item {
                offset: 18,
                source: "no"
            })
        ));
        assert_eq!(splitter.held_bytes(), 0);
        assert!(matches!(
            splitter.feed(b"", |_| Ok::<_, &str>(())),
            Err(SplitError::Failed)
        ));
        assert!(matches!(splitter.finish(), Err(SplitError::Failed)));
    }

    #[test]
    fn errors_say_what_was_wrong_and_where() {
        let e = split(br#"{"items":[1}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the page is not a JSON list page at byte 11: mismatched bracket"
        );
        let e = split(br#"{"items":["#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the page ends after 10 bytes, before its JSON does"
        );
        let e = split(br#"{"items":[{"a":tru}]}"#).unwrap_err();
        assert!(e.to_string().contains("at byte 18"), "{e}");
        let e = split(br#"{"items":["\ud800"]}"#).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the item at byte 10 of the page: "),
            "{e}"
        );
    }

    /// A generated JSON value, kept as text where JSON allows choices (numbers).
    enum Gen {
        /// `null`, `true` or `false`.
        Literal(&'static str),
        /// A number's text.
        Number(String),
        /// A string.
        Str(String),
        /// An array.
        Array(Vec<Gen>),
        /// An object (keys may repeat).
        Object(Vec<(String, Gen)>),
    }

    /// Characters strings are made of: brackets, quotes, backslashes, controls, raw UTF-8 of
    /// every length.
    const CHARS: &[char] = &[
        'a',
        'z',
        '0',
        ' ',
        '{',
        '}',
        '[',
        ']',
        ',',
        ':',
        '"',
        '\\',
        '/',
        '\n',
        '\t',
        '\u{1}',
        '\u{7f}',
        'é',
        'ß',
        '中',
        '\u{ffff}',
        '😀',
        '\u{10ffff}',
    ];

    /// A random string.
    fn random_string(rng: &mut StdRng) -> String {
        (0..rng.random_range(0..12))
            .map(|_| CHARS[rng.random_range(0..CHARS.len())])
            .collect()
    }

    /// A random number's text, of every shape JSON has.
    fn random_number(rng: &mut StdRng) -> String {
        let mut text = String::new();
        if rng.random_bool(0.3) {
            text.push('-');
        }
        if rng.random_bool(0.2) {
            text.push('0');
        } else {
            let digits = rng.random_range(0..63);
            text.push_str(&rng.random_range(1..u64::MAX >> digits).to_string());
        }
        if rng.random_bool(0.3) {
            text.push('.');
            text.push_str(&rng.random_range(0..100_000u32).to_string());
        }
        if rng.random_bool(0.2) {
            text.push(if rng.random_bool(0.5) { 'e' } else { 'E' });
            text.push_str(["", "+", "-"][rng.random_range(0..3)]);
            text.push_str(&rng.random_range(0..300u32).to_string());
        }
        text
    }

    /// A random value nesting at most `depth` more levels.
    fn random_value(rng: &mut StdRng, depth: usize) -> Gen {
        match rng.random_range(0..if depth == 0 { 4 } else { 6 }) {
            0 => Gen::Literal(["null", "true", "false"][rng.random_range(0..3)]),
            1 => Gen::Number(random_number(rng)),
            2 | 3 => Gen::Str(random_string(rng)),
            4 => Gen::Array(
                (0..rng.random_range(0..5))
                    .map(|_| random_value(rng, depth - 1))
                    .collect(),
            ),
            _ => Gen::Object(
                (0..rng.random_range(0..5))
                    .map(|_| (random_string(rng), random_value(rng, depth - 1)))
                    .collect(),
            ),
        }
    }

    /// A random list page: its keys in a random order, now and then an unknown or a repeated
    /// one.
    fn random_page(rng: &mut StdRng) -> Gen {
        let mut keys = vec![
            ("kind".to_string(), Gen::Str("NodeList".into())),
            ("apiVersion".to_string(), Gen::Str("v1".into())),
        ];
        if rng.random_bool(0.8) {
            let token = match rng.random_range(0..3) {
                0 => Gen::Literal("null"),
                _ => Gen::Str(random_string(rng)),
            };
            let mut metadata = vec![("resourceVersion".into(), Gen::Str("7".into()))];
            if rng.random_bool(0.8) {
                metadata.push(("continue".into(), token));
            }
            keys.push(("metadata".into(), Gen::Object(metadata)));
        }
        if rng.random_bool(0.9) {
            let items = (0..rng.random_range(0..6))
                .map(|_| match rng.random_range(0..5) {
                    0 => random_value(rng, 3),
                    _ => Gen::Object(vec![
                        ("metadata".into(), random_value(rng, 2)),
                        ("status".into(), random_value(rng, 4)),
                    ]),
                })
                .collect();
            keys.push(("items".into(), Gen::Array(items)));
        }
        for _ in 0..rng.random_range(0..3) {
            let key = match rng.random_range(0..10) {
                0 => "items".to_string(),
                1 => "metadata".to_string(),
                _ => random_string(rng),
            };
            keys.push((key, random_value(rng, 4)));
        }
        let at = rng.random_range(0..keys.len());
        keys.rotate_left(at);
        Gen::Object(keys)
    }

    /// Random whitespace (often none).
    fn write_space(rng: &mut StdRng, out: &mut Vec<u8>) {
        while rng.random_bool(0.15) {
            out.push([b' ', b'\n', b'\r', b'\t'][rng.random_range(0..4)]);
        }
    }

    /// A string's JSON, its characters escaped at random (`\uXXXX`, surrogate pairs
    /// included) where they need not be.
    fn write_string(rng: &mut StdRng, s: &str, out: &mut Vec<u8>) {
        out.push(b'"');
        for c in s.chars() {
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '\n' => Some("\\n"),
                '\t' => Some("\\t"),
                '/' if rng.random_bool(0.5) => Some("\\/"),
                _ => None,
            };
            if let Some(short) = short {
                out.extend_from_slice(short.as_bytes());
            } else if c < ' ' || rng.random_bool(0.2) {
                let mut units = [0; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.extend_from_slice(format!("\\u{unit:04x}").as_bytes());
                }
            } else {
                out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
            }
        }
        out.push(b'"');
    }

    /// `value`'s JSON, with random whitespace and escapes.
    fn write_value(rng: &mut StdRng, value: &Gen, out: &mut Vec<u8>) {
        match value {
            Gen::Literal(text) => out.extend_from_slice(text.as_bytes()),
            Gen::Number(text) => out.extend_from_slice(text.as_bytes()),
            Gen::Str(s) => write_string(rng, s, out),
            Gen::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_space(rng, out);
                    write_value(rng, item, out);
                    write_space(rng, out);
                }
                out.push(b']');
            }
            Gen::Object(members) => {
                out.push(b'{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_space(rng, out);
                    write_string(rng, key, out);
                    write_space(rng, out);
                    out.push(b':');
                    write_space(rng, out);
                    write_value(rng, value, out);
                    write_space(rng, out);
                }
                out.push(b'}');
            }
        }
    }

    /// Bytes a mutation puts in: JSON's structure, escapes, digits, bytes of broken UTF-8.
    const MUTATIONS: &[u8] = b"{}[]\",:\\u0123456789-+.eEtrufalsn \n\x01\x7f\xc3\xa9\xff\xed";

    /// `page` with a few random bytes replaced, inserted or removed.
    fn mutate(rng: &mut StdRng, page: &[u8]) -> Vec<u8> {
        let mut page = page.to_vec();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..=page.len());
            let byte = MUTATIONS[rng.random_range(0..MUTATIONS.len())];
            match rng.random_range(0..3) {
                0 if at < page.len() => page[at] = byte,
                1 if at < page.len() => {
                    page.remove(at);
                }
                _ => page.insert(at, byte),
            }
        }
        page
    }

    #[test]
    fn random_pages_split_as_serde_decodes_them_in_random_chunks() {
        let started = Instant::now();
        let mut rng = StdRng::seed_from_u64(0x5eed_d3a7);
        let (mut pages, mut valid, mut items) = (0, 0, 0);
        for _ in 0..300 {
            let mut page = Vec::new();
            write_space(&mut rng, &mut page);
            let generated = random_page(&mut rng);
            write_value(&mut rng, &generated, &mut page);
            write_space(&mut rng, &mut page);
            let mut layouts = vec![mutate(&mut rng, &page)];
            if let Ok(value) = serde_json::from_slice::<Value>(&page) {
                layouts.push(serde_json::to_vec(&value).unwrap());
                layouts.push(serde_json::to_vec_pretty(&value).unwrap());
            }
            layouts.push(page);
            for layout in &layouts {
                let max_chunk = rng.random_range(1..=layout.len().max(1));
                let (got, _) =
                    split_sized(layout, MAX_ITEM_BYTES, || rng.random_range(0..=max_chunk));
                if let Ok((found, _)) = &got {
                    valid += 1;
                    items += found.len();
                }
                pages += 1;
                assert_agree(layout, got);
            }
        }
        // The generator makes mostly valid pages, with items, and some rejected ones.
        assert!(
            valid > pages / 2 && valid < pages,
            "{valid} of {pages} pages valid"
        );
        assert!(items > 1000, "{items} items");
        eprintln!(
            "{pages} pages ({valid} valid, {items} items) in {:?}",
            started.elapsed()
        );
    }
}
