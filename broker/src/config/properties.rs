//! A parser for Java `.properties` text, enough for Kafka's `server.properties`.
//!
//! Supported: `key=value`, `key: value` and `key value`; `#` and `!` comment lines; blank lines;
//! backslash line continuation (the next line's leading whitespace is dropped); the escapes
//! `\t \n \r \f \\ \uXXXX` (any other escaped character stands for itself). Unlike Java, trailing
//! whitespace of a value is trimmed too. Later duplicates of a key win, as in Java.

/// One `key=value` pair and the (1-based) line it starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Property {
    pub(super) key: String,
    pub(super) value: String,
    pub(super) line: usize,
}

/// A syntax error: the 1-based line and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SyntaxError {
    pub(super) line: usize,
    pub(super) message: String,
}

/// Properties whitespace: space, tab and form feed.
fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\u{c}')
}

/// Whether the line ends in an odd number of backslashes (a continuation).
fn continues(line: &str) -> bool {
    line.chars().rev().take_while(|&c| c == '\\').count() % 2 == 1
}

/// Parses properties text into pairs in file order.
pub(super) fn parse(text: &str) -> Result<Vec<Property>, SyntaxError> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        let start = line.trim_start_matches(is_ws);
        if start.is_empty() || start.starts_with('#') || start.starts_with('!') {
            continue;
        }
        let mut logical = start.to_string();
        while continues(&logical) {
            logical.pop();
            match lines.next() {
                Some((_, next)) => logical.push_str(next.trim_start_matches(is_ws)),
                None => break,
            }
        }
        let line_no = index + 1;
        let (raw_key, raw_value) = split_key_value(&logical);
        let key = unescape(raw_key).map_err(|message| SyntaxError {
            line: line_no,
            message,
        })?;
        let value = unescape(raw_value.trim_end_matches(is_ws)).map_err(|message| SyntaxError {
            line: line_no,
            message,
        })?;
        out.push(Property {
            key,
            value,
            line: line_no,
        });
    }
    Ok(out)
}

/// Splits a logical line at the first unescaped `=`, `:` or whitespace (still escaped).
fn split_key_value(logical: &str) -> (&str, &str) {
    let mut escaped = false;
    for (i, c) in logical.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        if c == '\\' {
            escaped = true;
            continue;
        }
        if c == '=' || c == ':' || is_ws(c) {
            let key = logical.get(..i).unwrap_or("");
            let mut rest = logical.get(i..).unwrap_or("").trim_start_matches(is_ws);
            if is_ws(c) {
                // `key = value` or `key value`: at most one separator after the whitespace.
                if let Some(r) = rest.strip_prefix('=').or_else(|| rest.strip_prefix(':')) {
                    rest = r;
                }
            } else {
                rest = rest.get(c.len_utf8()..).unwrap_or("");
            }
            return (key, rest.trim_start_matches(is_ws));
        }
    }
    (logical, "")
}

/// Resolves backslash escapes.
fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let decoded = (hex.len() == 4)
                    .then(|| u32::from_str_radix(&hex, 16).ok())
                    .flatten()
                    .and_then(char::from_u32);
                match decoded {
                    Some(ch) => out.push(ch),
                    None => return Err(format!("malformed \\uxxxx escape `\\u{hex}`")),
                }
            }
            Some(other) => out.push(other),
            // A lone trailing backslash (continuation at end of text): dropped.
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(text: &str) -> Vec<(String, String)> {
        parse(text)
            .unwrap()
            .into_iter()
            .map(|p| (p.key, p.value))
            .collect()
    }

    fn p(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn separators_comments_and_whitespace() {
        let text =
            "# comment\n! also comment\n\n  a=1\nb : 2\nc 3\n d\t=\t4  \ne:\nf\n  # indented comment\n";
        assert_eq!(
            pairs(text),
            vec![
                p("a", "1"),
                p("b", "2"),
                p("c", "3"),
                p("d", "4"),
                p("e", ""),
                p("f", "")
            ]
        );
    }

    #[test]
    fn value_keeps_later_separators() {
        assert_eq!(
            pairs("listeners=PLAINTEXT://:9092,CONTROLLER://:9093\nmap=A:B,C:D\nx = = y"),
            vec![
                p("listeners", "PLAINTEXT://:9092,CONTROLLER://:9093"),
                p("map", "A:B,C:D"),
                p("x", "= y")
            ]
        );
    }

    #[test]
    fn continuation_lines() {
        let text = "listeners=PLAINTEXT://:9092,\\\n    CONTROLLER://:9093\nnext=1\n";
        let props = parse(text).unwrap();
        assert_eq!(props[0].value, "PLAINTEXT://:9092,CONTROLLER://:9093");
        assert_eq!(props[0].line, 1);
        assert_eq!(
            props[1],
            Property {
                key: "next".into(),
                value: "1".into(),
                line: 3
            }
        );
        // An even number of backslashes is an escaped backslash, not a continuation.
        assert_eq!(pairs("a=x\\\\\nb=y"), vec![p("a", "x\\"), p("b", "y")]);
        // A comment line never continues.
        assert_eq!(pairs("# c \\\nb=y"), vec![p("b", "y")]);
        // Continuation at end of text.
        assert_eq!(pairs("a=x\\"), vec![p("a", "x")]);
    }

    #[test]
    fn escapes_and_crlf() {
        assert_eq!(
            pairs("a\\=b=c\\td\\u0041\r\nk\\ ey=v"),
            vec![p("a=b", "c\tdA"), p("k ey", "v")]
        );
        let err = parse("ok=1\nbad=\\u12").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.message.contains("\\u"), "{}", err.message);
    }
}
