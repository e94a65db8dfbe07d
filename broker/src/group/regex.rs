//! A small regular-expression matcher for KIP-848 topic subscriptions
//! (`SubscribedTopicRegex`). Kafka compiles these with RE2/J and resolves them with a full match
//! against topic names; this is the subset topic patterns need, with RE2's guarantee that
//! matching takes linear time (a Pike VM over a Thompson NFA, no backtracking).
//!
//! Supported: literals; `.`; escapes `\\ \. \* \+ \? \( \) \[ \] \{ \} \| \^ \$ \-` and any
//! other escaped punctuation; classes `\d \D \w \W \s \S`; bracket classes `[a-z0-9_.-]`,
//! negated `[^...]`, with ranges, escapes and `\d \w \s` inside; groups `(...)` and `(?:...)`;
//! alternation `|`; quantifiers `* + ? {n} {n,} {n,m}` (a trailing `?` for laziness is accepted
//! and ignored, as it cannot change a full match); anchors `^` and `$`. Not supported (an
//! INVALID_REGULAR_EXPRESSION answer): flags `(?i)`, named groups, Unicode classes `\p{..}`,
//! back-references and look-around (RE2 has none of the last two either).
//! Patterns are limited to [`MAX_PATTERN_BYTES`] and to [`MAX_PROGRAM`] compiled instructions.

/// Longest accepted pattern.
pub(crate) const MAX_PATTERN_BYTES: usize = 1024;
/// Largest compiled program (bounds `{n,m}` expansion).
pub(crate) const MAX_PROGRAM: usize = 20_000;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Class {
    ranges: Vec<(char, char)>,
    negated: bool,
}

impl Class {
    fn matches(&self, c: char) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != self.negated
    }
}

#[derive(Debug, Clone)]
enum Node {
    Empty,
    Char(char),
    Any,
    Class(Class),
    Start,
    End,
    Concat(Vec<Node>),
    Alt(Vec<Node>),
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
}

#[derive(Debug, Clone)]
enum Inst {
    Char(char),
    Any,
    Class(Class),
    Split(usize, usize),
    Jmp(usize),
    Start,
    End,
    Match,
}

/// A compiled pattern; [`Regex::is_full_match`] is Java's `Matcher.matches()`.
#[derive(Debug, Clone)]
pub(crate) struct Regex {
    prog: Vec<Inst>,
}

impl Regex {
    pub(crate) fn new(pattern: &str) -> Result<Regex, String> {
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(format!("the pattern is longer than {MAX_PATTERN_BYTES} bytes"));
        }
        let mut p = Parser {
            chars: pattern.chars().collect(),
            pos: 0,
            depth: 0,
        };
        let node = p.alternation()?;
        if p.pos < p.chars.len() {
            return Err(format!("unexpected ')' at position {}", p.pos));
        }
        let mut c = Compiler { prog: Vec::new() };
        c.node(&node)?;
        c.push(Inst::Match)?;
        Ok(Regex { prog: c.prog })
    }

    pub(crate) fn is_full_match(&self, text: &str) -> bool {
        let n = self.prog.len();
        let mut current: Vec<usize> = Vec::with_capacity(n);
        let mut next: Vec<usize> = Vec::with_capacity(n);
        let mut seen = vec![usize::MAX; n];
        let chars: Vec<char> = text.chars().collect();
        let len = chars.len();
        self.add(&mut current, &mut seen, 0, 0, len, 0);
        for (i, &c) in chars.iter().enumerate() {
            if current.is_empty() {
                return false;
            }
            next.clear();
            let step = i + 1;
            for &pc in &current {
                let ok = match self.prog.get(pc) {
                    Some(Inst::Char(x)) => *x == c,
                    Some(Inst::Any) => c != '\n',
                    Some(Inst::Class(cls)) => cls.matches(c),
                    _ => false,
                };
                if ok {
                    self.add(&mut next, &mut seen, pc + 1, step, len, step);
                }
            }
            std::mem::swap(&mut current, &mut next);
        }
        current
            .iter()
            .any(|&pc| matches!(self.prog.get(pc), Some(Inst::Match)))
    }

    /// Adds `pc` and everything reachable from it without consuming input (iteratively).
    fn add(&self, list: &mut Vec<usize>, seen: &mut [usize], pc: usize, pos: usize, len: usize, gen: usize) {
        let mut stack = vec![pc];
        while let Some(pc) = stack.pop() {
            match seen.get_mut(pc) {
                Some(s) if *s != gen => *s = gen,
                _ => continue,
            }
            match self.prog.get(pc) {
                Some(Inst::Jmp(a)) => stack.push(*a),
                Some(Inst::Split(a, b)) => {
                    stack.push(*b);
                    stack.push(*a);
                }
                Some(Inst::Start) if pos == 0 => stack.push(pc + 1),
                Some(Inst::End) if pos == len => stack.push(pc + 1),
                Some(Inst::Start | Inst::End) => {}
                Some(_) => list.push(pc),
                None => {}
            }
        }
    }
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
    depth: usize,
}

const MAX_DEPTH: usize = 100;

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }
    fn bump(&mut self) -> Option<char> {
        let c = self.peek();
        if c.is_some() {
            self.pos += 1;
        }
        c
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn alternation(&mut self) -> Result<Node, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err("the pattern nests too deeply".into());
        }
        let mut alts = vec![self.concat()?];
        while self.eat('|') {
            alts.push(self.concat()?);
        }
        self.depth -= 1;
        Ok(if alts.len() == 1 {
            alts.pop().unwrap_or(Node::Empty)
        } else {
            Node::Alt(alts)
        })
    }

    fn concat(&mut self) -> Result<Node, String> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            items.push(self.quantified(atom)?);
        }
        Ok(match items.len() {
            0 => Node::Empty,
            1 => items.pop().unwrap_or(Node::Empty),
            _ => Node::Concat(items),
        })
    }

    fn quantified(&mut self, atom: Node) -> Result<Node, String> {
        let mut node = atom;
        loop {
            let (min, max) = match self.peek() {
                Some('*') => {
                    self.pos += 1;
                    (0, None)
                }
                Some('+') => {
                    self.pos += 1;
                    (1, None)
                }
                Some('?') => {
                    self.pos += 1;
                    (0, Some(1))
                }
                Some('{') => match self.counted()? {
                    Some(r) => r,
                    None => return Ok(node),
                },
                _ => return Ok(node),
            };
            if matches!(node, Node::Start | Node::End | Node::Empty) {
                return Err("nothing to repeat".into());
            }
            if matches!(node, Node::Repeat { .. }) {
                return Err("a repetition cannot be repeated".into());
            }
            self.eat('?'); // lazy: same full-match result
            node = Node::Repeat {
                node: Box::new(node),
                min,
                max,
            };
        }
    }

    /// `{n}`, `{n,}`, `{n,m}`; `None` if the brace is a literal (RE2 treats `{` without a valid
    /// count as a literal).
    fn counted(&mut self) -> Result<Option<(u32, Option<u32>)>, String> {
        let start = self.pos;
        self.pos += 1;
        let number = |p: &mut Parser| -> Option<u32> {
            let s = p.pos;
            while matches!(p.peek(), Some(c) if c.is_ascii_digit()) {
                p.pos += 1;
            }
            let digits: String = p.chars.get(s..p.pos)?.iter().collect();
            digits.parse().ok()
        };
        let Some(min) = number(self) else {
            self.pos = start;
            return Ok(None);
        };
        let max = if self.eat(',') {
            if self.peek() == Some('}') {
                None
            } else {
                match number(self) {
                    Some(m) => Some(m),
                    None => {
                        self.pos = start;
                        return Ok(None);
                    }
                }
            }
        } else {
            Some(min)
        };
        if !self.eat('}') {
            self.pos = start;
            return Ok(None);
        }
        if min > 1000 || max.is_some_and(|m| m > 1000 || m < min) {
            return Err("invalid repetition count".into());
        }
        Ok(Some((min, max)))
    }

    fn atom(&mut self) -> Result<Node, String> {
        let c = self.bump().ok_or("unexpected end")?;
        match c {
            '.' => Ok(Node::Any),
            '^' => Ok(Node::Start),
            '$' => Ok(Node::End),
            '(' => {
                if self.eat('?') && !self.eat(':') {
                    return Err("only non-capturing groups (?:...) are supported".into());
                }
                let inner = self.alternation()?;
                if !self.eat(')') {
                    return Err("missing ')'".into());
                }
                // A group is an atom of its own: `(a*)*` is valid where `a**` is not.
                Ok(Node::Concat(vec![inner]))
            }
            '[' => self.class(),
            '\\' => self.escape(false).map(|e| match e {
                Escaped::Char(c) => Node::Char(c),
                Escaped::Class(cls) => Node::Class(cls),
            }),
            '*' | '+' | '?' => Err(format!("missing argument to repetition operator '{c}'")),
            c => Ok(Node::Char(c)),
        }
    }

    fn escape(&mut self, in_class: bool) -> Result<Escaped, String> {
        let c = self.bump().ok_or("trailing backslash")?;
        let class = |ranges: Vec<(char, char)>, negated| Escaped::Class(Class { ranges, negated });
        let digit = vec![('0', '9')];
        let word = vec![('0', '9'), ('A', 'Z'), ('_', '_'), ('a', 'z')];
        let space = vec![('\t', '\n'), ('\u{b}', '\u{b}'), ('\u{c}', '\r'), (' ', ' ')];
        Ok(match c {
            'd' => class(digit, false),
            'D' => class(digit, true),
            'w' => class(word, false),
            'W' => class(word, true),
            's' => class(space, false),
            'S' => class(space, true),
            'n' => Escaped::Char('\n'),
            't' => Escaped::Char('\t'),
            'r' => Escaped::Char('\r'),
            'f' => Escaped::Char('\u{c}'),
            c if c.is_ascii_punctuation() => Escaped::Char(c),
            c if in_class && c == ' ' => Escaped::Char(c),
            c => return Err(format!("unsupported escape '\\{c}'")),
        })
    }

    fn class(&mut self) -> Result<Node, String> {
        let negated = self.eat('^');
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let c = self.bump().ok_or("missing ']'")?;
            if c == ']' && !first {
                break;
            }
            first = false;
            let lo = match c {
                '\\' => match self.escape(true)? {
                    Escaped::Char(c) => c,
                    Escaped::Class(cls) => {
                        if cls.negated {
                            return Err("negated classes inside [...] are not supported".into());
                        }
                        ranges.extend(cls.ranges);
                        continue;
                    }
                },
                '[' if self.peek() == Some(':') => {
                    return Err("POSIX classes [:name:] are not supported".into());
                }
                c => c,
            };
            if self.peek() == Some('-') && self.chars.get(self.pos + 1).is_some_and(|&n| n != ']') {
                self.pos += 1;
                let hi = match self.bump().ok_or("missing ']'")? {
                    '\\' => match self.escape(true)? {
                        Escaped::Char(c) => c,
                        Escaped::Class(_) => return Err("a class cannot end a range".into()),
                    },
                    c => c,
                };
                if hi < lo {
                    return Err(format!("invalid range {lo}-{hi}"));
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        Ok(Node::Class(Class { ranges, negated }))
    }
}

enum Escaped {
    Char(char),
    Class(Class),
}

struct Compiler {
    prog: Vec<Inst>,
}

impl Compiler {
    fn push(&mut self, inst: Inst) -> Result<usize, String> {
        if self.prog.len() >= MAX_PROGRAM {
            return Err("the pattern is too large".into());
        }
        self.prog.push(inst);
        Ok(self.prog.len() - 1)
    }

    fn set(&mut self, at: usize, inst: Inst) {
        if let Some(slot) = self.prog.get_mut(at) {
            *slot = inst;
        }
    }

    fn node(&mut self, node: &Node) -> Result<(), String> {
        match node {
            Node::Empty => {}
            Node::Char(c) => {
                self.push(Inst::Char(*c))?;
            }
            Node::Any => {
                self.push(Inst::Any)?;
            }
            Node::Class(c) => {
                self.push(Inst::Class(c.clone()))?;
            }
            Node::Start => {
                self.push(Inst::Start)?;
            }
            Node::End => {
                self.push(Inst::End)?;
            }
            Node::Concat(items) => {
                for n in items {
                    self.node(n)?;
                }
            }
            Node::Alt(alts) => {
                let mut jumps = Vec::new();
                for (i, alt) in alts.iter().enumerate() {
                    if i + 1 < alts.len() {
                        let split = self.push(Inst::Split(0, 0))?;
                        self.node(alt)?;
                        jumps.push(self.push(Inst::Jmp(0))?);
                        let next = self.prog.len();
                        self.set(split, Inst::Split(split + 1, next));
                    } else {
                        self.node(alt)?;
                    }
                }
                let end = self.prog.len();
                for j in jumps {
                    self.set(j, Inst::Jmp(end));
                }
            }
            Node::Repeat { node, min, max } => {
                for _ in 0..*min {
                    self.node(node)?;
                }
                match max {
                    None => {
                        // x*: L: split(body, out); body; jmp L
                        let split = self.push(Inst::Split(0, 0))?;
                        self.node(node)?;
                        self.push(Inst::Jmp(split))?;
                        let out = self.prog.len();
                        self.set(split, Inst::Split(split + 1, out));
                    }
                    Some(max) => {
                        let mut splits = Vec::new();
                        for _ in *min..*max {
                            splits.push(self.push(Inst::Split(0, 0))?);
                            self.node(node)?;
                        }
                        let out = self.prog.len();
                        for s in splits {
                            self.set(s, Inst::Split(s + 1, out));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, t: &str) -> bool {
        Regex::new(p).unwrap().is_full_match(t)
    }

    #[test]
    fn full_match_semantics() {
        assert!(m("orders", "orders"));
        assert!(!m("orders", "orders-1"), "a full match, as Java's matches()");
        assert!(m("orders.*", "orders-1"));
        assert!(m("orders\\..*", "orders.eu"));
        assert!(!m("orders\\..*", "orders-eu"));
        assert!(m("^t[0-9]+$", "t42"));
        assert!(!m("t[0-9]+", "t"));
        assert!(m("(foo|bar)-\\d{2,3}", "bar-123"));
        assert!(!m("(foo|bar)-\\d{2,3}", "bar-1234"));
        assert!(m("(?:a|b)*c", "ababc"));
        assert!(m("[^_].*", "x_"));
        assert!(!m("[^_].*", "_x"));
        assert!(m("[a-c-]+", "a-b-c"));
        assert!(m("a{3}", "aaa"));
        assert!(m("x{,}", "x{,}"), "an invalid count is a literal brace, as RE2");
        assert!(m("\\w+\\.\\w+", "topic_1.v2"));
        assert!(m("a?b+?", "abb"));
        assert!(m("", ""));
    }

    #[test]
    fn linear_time_on_pathological_patterns() {
        let p = "(a*)*b";
        let text = "a".repeat(5000);
        assert!(!m(p, &text));
        let p = "(a|a)*(a|a)*(a|a)*c";
        assert!(!m(p, &"a".repeat(3000)));
    }

    #[test]
    fn rejects_invalid_and_unsupported() {
        for p in [
            "(", ")", "[a", "a**", "*a", "a{5,2}", "\\p{L}", "(?i)a", "(?P<x>a)", "\\", "[z-a]",
        ] {
            assert!(Regex::new(p).is_err(), "{p} should be rejected");
        }
        assert!(Regex::new(&"a".repeat(MAX_PATTERN_BYTES + 1)).is_err());
        assert!(Regex::new("(a{1000}){1000}").is_err(), "program size is bounded");
    }
}
