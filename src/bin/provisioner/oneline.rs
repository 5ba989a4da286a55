//! Log lines that no request can forge: each event the text log writes is one line, whatever
//! its fields carry. A value from a request (an id, a path, an error quoting either) may hold
//! a newline and a made-up timestamp after it; written as is, it would read as a second event
//! (issue 30, item 10). [`OneLine`] is the log's writer: it escapes every line break and control
//! character inside an event (`\n`, `\r`, `\u{1b}`, ...), keeping only the event's final
//! newline (and, on a terminal, the colours the formatter itself writes).

use std::io::Write;

/// Makes the writer of each event: stderr, one line per event.
#[derive(Debug, Clone, Copy)]
pub struct OneLine {
    /// Whether the formatter writes colours (escape sequences kept as they are).
    pub ansi: bool,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for OneLine {
    type Writer = Escaping;
    fn make_writer(&'a self) -> Self::Writer {
        Escaping { ansi: self.ansi, buffer: Vec::new() }
    }
}

/// One event's writer: gathers the event, then writes it escaped, in one write, when dropped.
#[derive(Debug)]
pub struct Escaping {
    ansi: bool,
    buffer: Vec<u8>,
}

impl Write for Escaping {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Escaping {
    fn drop(&mut self) {
        let text = one_line(&String::from_utf8_lossy(&self.buffer), self.ansi);
        let _ = std::io::stderr().write_all(text.as_bytes());
    }
}

/// `event` as one line: every control character but a final newline (and escape sequences'
/// `ESC` when `ansi`) written as an escape.
pub fn one_line(event: &str, ansi: bool) -> String {
    let body = event.strip_suffix('\n').unwrap_or(event);
    let mut out = String::with_capacity(event.len() + 1);
    for c in body.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push('\t'),
            '\u{1b}' if ansi => out.push(c),
            c if c.is_control() => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_one_line_whatever_its_fields_carry() {
        let forged =
            "2026-12-06T00:00:00Z ERROR request: ids: [\"9\n2030-01-01T00:00:00Z  INFO audit: all is well\r\"]\n";
        let line = one_line(forged, false);
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(line.ends_with("\\r\"]\n"), "{line}");
        assert!(line.contains("[\"9\\n2030-01-01T00:00:00Z  INFO audit"), "{line}");
        assert_eq!(one_line("a \u{1b}[31mred\u{1b}[0m\n", false), "a \\u{1b}[31mred\\u{1b}[0m\n");
        assert_eq!(one_line("a \u{1b}[31mred\u{1b}[0m\n", true), "a \u{1b}[31mred\u{1b}[0m\n");
        assert_eq!(one_line("plain\tline\n", false), "plain\tline\n");
    }
}
