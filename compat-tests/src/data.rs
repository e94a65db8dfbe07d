//! Test data: records to produce and what consumers read, with the JSON form shared with the
//! Python scripts (bytes as lowercase hex, `null` for null).

use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A record to produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestRecord {
    /// Target partition.
    pub partition: i32,
    /// Key (`None` = null key).
    pub key: Option<Vec<u8>>,
    /// Value (`None` = null value, a tombstone).
    pub value: Option<Vec<u8>>,
    /// Headers in order; duplicate names allowed; `None` = null header value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// CreateTime timestamp in ms (`None` = let the client pick "now").
    pub timestamp: Option<i64>,
}

/// A record as a consumer read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumed {
    /// Partition it was read from.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Key.
    pub key: Option<Vec<u8>>,
    /// Value.
    pub value: Option<Vec<u8>>,
    /// Headers in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Timestamp in ms, if the client reported one.
    pub timestamp: Option<i64>,
}

impl Consumed {
    /// Whether key, value and headers equal those of `r` (and the partition matches).
    pub fn same_content(&self, r: &TestRecord) -> bool {
        self.partition == r.partition
            && self.key == r.key
            && self.value == r.value
            && self.headers == r.headers
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Parses lowercase or uppercase hex; `None` if malformed.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() & 1 == 1 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

fn opt_hex(b: &Option<Vec<u8>>) -> Value {
    match b {
        Some(b) => Value::String(hex(b)),
        None => Value::Null,
    }
}

fn headers_json(h: &[(String, Option<Vec<u8>>)]) -> Value {
    Value::Array(h.iter().map(|(k, v)| json!([k, opt_hex(v)])).collect())
}

/// JSON form of a record to produce.
pub fn record_to_json(r: &TestRecord) -> Value {
    json!({
        "partition": r.partition,
        "key": opt_hex(&r.key),
        "value": opt_hex(&r.value),
        "headers": headers_json(&r.headers),
        "timestamp": r.timestamp,
    })
}

fn field_opt_bytes(v: &Value, name: &str) -> Result<Option<Vec<u8>>, String> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => unhex(s).map(Some).ok_or_else(|| format!("{name}: bad hex {s:?}")),
        Some(other) => Err(format!("{name}: expected hex string or null, got {other}")),
    }
}

/// Parses a consumed record from the scripts' JSON.
pub fn consumed_from_json(v: &Value) -> Result<Consumed, String> {
    let int = |name: &str| {
        v.get(name)
            .and_then(Value::as_i64)
            .ok_or_else(|| format!("missing {name} in {v}"))
    };
    let mut headers = Vec::new();
    for h in v
        .get("headers")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("missing headers in {v}"))?
    {
        let pair = h
            .as_array()
            .filter(|a| a.len() == 2)
            .ok_or_else(|| format!("bad header {h}"))?;
        let name = pair[0]
            .as_str()
            .ok_or_else(|| format!("bad header name {h}"))?
            .to_string();
        let value = match &pair[1] {
            Value::Null => None,
            Value::String(s) => Some(unhex(s).ok_or_else(|| format!("bad header hex {h}"))?),
            other => return Err(format!("bad header value {other}")),
        };
        headers.push((name, value));
    }
    Ok(Consumed {
        partition: int("partition")? as i32,
        offset: int("offset")?,
        key: field_opt_bytes(v, "key")?,
        value: field_opt_bytes(v, "value")?,
        headers,
        timestamp: v.get("timestamp").and_then(Value::as_i64),
    })
}

/// A small deterministic generator (splitmix64), so failures are reproducible.
#[derive(Clone, Debug)]
pub struct Gen(u64);

impl Gen {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Gen {
        Gen(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// `len` random bytes, none of them in `excluded`.
    pub fn bytes(&mut self, len: usize, excluded: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(len);
        while v.len() < len {
            let b = self.next_u64() as u8;
            if !excluded.contains(&b) {
                v.push(b);
            }
        }
        v
    }
}

/// `n` records over `partitions` partitions with every corner the clients must keep apart:
/// binary keys and values (all byte values), empty vs null key and value, null header
/// values, duplicate header names, explicit timestamps. Record `i` goes to partition
/// `i % partitions` and its key starts with `i` in decimal, so it is easy to identify.
pub fn varied_records(n: usize, partitions: i32, seed: u64) -> Vec<TestRecord> {
    let mut g = Gen::new(seed);
    let base_ts = 1_700_000_000_000i64;
    (0..n)
        .map(|i| {
            let mut key = format!("key-{i}-").into_bytes();
            let klen = g.below(24) as usize;
            key.extend(g.bytes(klen, &[]));
            let vlen = g.below(300) as usize;
            let mut value = format!("value-{i}:").into_bytes();
            value.extend(g.bytes(vlen, &[]));
            let (key, value) = match i % 10 {
                3 => (None, Some(value)),
                4 => (Some(key), None),
                5 => (Some(Vec::new()), Some(Vec::new())),
                _ => (Some(key), Some(value)),
            };
            let mut headers = vec![("seq".to_string(), Some(i.to_string().into_bytes()))];
            match i % 7 {
                1 => headers.push(("nullable".to_string(), None)),
                2 => {
                    headers.push(("dup".to_string(), Some(b"first".to_vec())));
                    headers.push(("dup".to_string(), Some(b"second".to_vec())));
                }
                3 => headers.push(("bin".to_string(), Some(g.bytes(16, &[])))),
                4 => headers.push(("empty".to_string(), Some(Vec::new()))),
                _ => {}
            }
            TestRecord {
                partition: (i as i32) % partitions,
                key,
                value,
                headers,
                timestamp: Some(base_ts + i as i64),
            }
        })
        .collect()
}

/// Checks that `got` is exactly `expected` produced at `offsets` (same order as
/// `expected`): every record read once, at its offset, byte-identical, timestamps equal
/// when `check_timestamps`. Returns a description of the first differences.
pub fn compare_read_back(
    who: &str,
    expected: &[TestRecord],
    offsets: &[i64],
    got: &[Consumed],
    check_timestamps: bool,
) -> Result<(), String> {
    assert_eq!(expected.len(), offsets.len());
    let mut problems = Vec::new();
    let mut by_pos = std::collections::BTreeMap::new();
    for c in got {
        if by_pos.insert((c.partition, c.offset), c).is_some() {
            problems.push(format!(
                "{who}: read partition {} offset {} twice",
                c.partition, c.offset
            ));
        }
    }
    if got.len() != expected.len() {
        problems.push(format!(
            "{who}: read {} records, expected {}",
            got.len(),
            expected.len()
        ));
    }
    for (r, &off) in expected.iter().zip(offsets) {
        match by_pos.get(&(r.partition, off)) {
            None => problems.push(format!("{who}: missing partition {} offset {off}", r.partition)),
            Some(c) => {
                if !c.same_content(r) {
                    problems.push(format!(
                        "{who}: partition {} offset {off} differs:\n  expected key={:?} value={:?} headers={:?}\n  got      key={:?} value={:?} headers={:?}",
                        r.partition, r.key.as_deref().map(hex), r.value.as_deref().map(hex), r.headers,
                        c.key.as_deref().map(hex), c.value.as_deref().map(hex), c.headers
                    ));
                } else if check_timestamps && r.timestamp.is_some() && c.timestamp != r.timestamp {
                    problems.push(format!(
                        "{who}: partition {} offset {off}: timestamp {:?}, expected {:?}",
                        r.partition, c.timestamp, r.timestamp
                    ));
                }
            }
        }
        if problems.len() > 10 {
            break;
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Offsets a fresh partition must assign to records produced in order: 0, 1, 2... per partition.
pub fn sequential_offsets(records: &[TestRecord]) -> Vec<i64> {
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    records
        .iter()
        .map(|r| {
            let n = next.entry(r.partition).or_insert(0);
            *n += 1;
            *n - 1
        })
        .collect()
}

/// The end offset of each of `partitions` fresh partitions once `records` are produced.
pub fn ends_of(records: &[TestRecord], partitions: i32) -> BTreeMap<i32, i64> {
    let mut ends: BTreeMap<i32, i64> = (0..partitions).map(|p| (p, 0)).collect();
    for r in records {
        *ends.entry(r.partition).or_insert(0) += 1;
    }
    ends
}

/// [`compare_read_back`] with timestamps, panicking with its report.
pub fn assert_read_back(who: &str, expected: &[TestRecord], offsets: &[i64], got: &[Consumed]) {
    if let Err(e) = compare_read_back(who, expected, offsets, got, true) {
        panic!("{e}");
    }
}

/// kafka-python cannot produce a null header value nor a record with both key and value
/// null; leave those corners to the other producers.
pub fn kafka_python_producible(mut records: Vec<TestRecord>) -> Vec<TestRecord> {
    for r in &mut records {
        r.headers.retain(|(_, v)| v.is_some());
        assert!(r.key.is_some() || r.value.is_some());
    }
    records
}
