//! Where things are in a scenario file, from the parsers' own positions: every key and array
//! element by its path (`events[2].set_life.machine`), with its line. A TOML file is indexed
//! from `toml`'s spanned document (`DeTable`, which recovers from syntax errors, so a broken
//! file is indexed up to the break); a JSON file from `serde_json`'s own tokenizer, read
//! through a counter of the bytes it has consumed.
//!
//! Parse errors are located by the error's own position (`toml::de::Error::span`,
//! `serde_json::Error::line` and `column`) and named by the last key that starts at or before
//! it; validation errors by the path of the value they are about.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::io;
use std::rc::Rc;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use toml::de::{DeTable, DeValue};

/// The file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.toml`.
    Toml,
    /// `.json`.
    Json,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Toml => "TOML",
            Format::Json => "JSON",
        })
    }
}

/// One key or array element.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// `cloud.faults[1].machine`.
    path: String,
    /// The key (`None` for an array element).
    key: Option<String>,
    /// Byte offset of the key (or the element) in the text.
    offset: usize,
}

/// The keys and elements of one scenario text, and its line starts.
#[derive(Debug, Clone, Default)]
pub(super) struct Locations {
    entries: Vec<Entry>,
    line_starts: Vec<usize>,
}

impl Locations {
    /// Indexes `text` (best effort: a broken file is indexed as far as its parser got).
    pub(super) fn index(text: &str, format: Format) -> Self {
        let mut entries = Vec::new();
        match format {
            Format::Toml => {
                let (doc, _errors) = DeTable::parse_recoverable(text);
                index_table(doc.get_ref(), "", &mut entries);
            }
            Format::Json => entries = index_json(text),
        }
        entries.sort_by_key(|e| e.offset);
        let line_starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Self { entries, line_starts }
    }

    /// The 1-based line of a byte offset.
    pub(super) fn line_of_offset(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|start| *start <= offset).max(1)
    }

    /// The line of `path`, or of its nearest ancestor that the file spells out.
    pub(super) fn line(&self, path: &str) -> Option<usize> {
        let mut path = path;
        loop {
            if let Some(e) = self.entries.iter().find(|e| e.path == path) {
                return Some(self.line_of_offset(e.offset));
            }
            path = &path[..path.rfind(['.', '['])?];
        }
    }

    /// Where a TOML parse error is: the line of its span, and the last key at or before it.
    pub(super) fn toml_error(&self, err: &toml::de::Error) -> (Option<usize>, Option<String>) {
        match err.span() {
            Some(span) => (Some(self.line_of_offset(span.start)), self.key_before(span.start).map(|(k, _)| k)),
            None => (None, None),
        }
    }

    /// Where a JSON parse error is. `serde_json` places an error after the bad value (often on
    /// the next line), so an error is put on the line of the last key before it when that key
    /// is at most two lines up.
    pub(super) fn json_error(&self, err: &serde_json::Error) -> (Option<usize>, Option<String>) {
        let line = err.line();
        if line == 0 {
            return (None, None);
        }
        let offset = self.line_starts.get(line - 1).map_or(usize::MAX, |start| start + err.column());
        match self.key_before(offset) {
            Some((key, key_line)) if key_line + 2 >= line => (Some(key_line), Some(key)),
            _ => (Some(line), None),
        }
    }

    /// The last key starting at or before `offset`, with its line.
    fn key_before(&self, offset: usize) -> Option<(String, usize)> {
        let e = self.entries.iter().rev().find(|e| e.key.is_some() && e.offset <= offset)?;
        Some((e.key.clone()?, self.line_of_offset(e.offset)))
    }
}

fn child(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

fn index_table(table: &DeTable<'_>, path: &str, out: &mut Vec<Entry>) {
    for (key, value) in table.iter() {
        let path = child(path, key.get_ref());
        out.push(Entry { path: path.clone(), key: Some(key.get_ref().to_string()), offset: key.span().start });
        index_value(value.get_ref(), &path, out);
    }
}

fn index_value(value: &DeValue<'_>, path: &str, out: &mut Vec<Entry>) {
    match value {
        DeValue::Table(t) => index_table(t, path, out),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let path = format!("{path}[{i}]");
                out.push(Entry { path: path.clone(), key: None, offset: item.span().start });
                index_value(item.get_ref(), &path, out);
            }
        }
        _ => {}
    }
}

/// The bytes of the text, handed to `serde_json` one at a time, counted.
struct Counted<'a> {
    bytes: &'a [u8],
    read: Rc<Cell<usize>>,
}

impl io::Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let at = self.read.get();
        let n = buf.len().min(1).min(self.bytes.len().saturating_sub(at));
        buf[..n].copy_from_slice(&self.bytes[at..at + n]);
        self.read.set(at + n);
        Ok(n)
    }
}

/// What the JSON walk shares: the byte counter and the entries found so far.
struct JsonIndex {
    read: Rc<Cell<usize>>,
    entries: RefCell<Vec<Entry>>,
}

impl JsonIndex {
    /// The offset of the byte `serde_json` looked at last (it peeks one byte ahead).
    fn last_byte(&self) -> usize {
        self.read.get().saturating_sub(1)
    }
}

fn index_json(text: &str) -> Vec<Entry> {
    let read = Rc::new(Cell::new(0));
    let index = JsonIndex { read: read.clone(), entries: RefCell::new(Vec::new()) };
    let mut de = serde_json::Deserializer::from_reader(Counted { bytes: text.as_bytes(), read });
    // A broken file keeps the entries found before the break.
    let _ = JsonWalk { index: &index, path: String::new() }.deserialize(&mut de);
    index.entries.into_inner()
}

/// Walks one JSON value, recording the keys and elements below it.
struct JsonWalk<'a> {
    index: &'a JsonIndex,
    path: String,
}

impl<'de> DeserializeSeed<'de> for JsonWalk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for JsonWalk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            let path = child(&self.path, &key);
            // The key's closing quote was the last byte read.
            let offset = self.index.last_byte();
            self.index.entries.borrow_mut().push(Entry { path: path.clone(), key: Some(key), offset });
            map.next_value_seed(JsonWalk { index: self.index, path })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        for i in 0.. {
            let path = format!("{}[{i}]", self.path);
            let element = Element(JsonWalk { index: self.index, path });
            if seq.next_element_seed(element)?.is_none() {
                break;
            }
        }
        Ok(())
    }
}

/// An array element: recorded where it starts (its first byte was just peeked at).
struct Element<'a>(JsonWalk<'a>);

impl<'de> DeserializeSeed<'de> for Element<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let Element(walk) = self;
        let offset = walk.index.last_byte();
        walk.index.entries.borrow_mut().push(Entry { path: walk.path.clone(), key: None, offset });
        walk.deserialize(d)
    }
}
