//! A Strand broker's own latency histograms over one phase: its Prometheus `/metrics` scraped
//! when the phase starts and when it ends, the bucket counts differenced.
//!
//! The client's latency says how long a produce took; these say how much of it the broker
//! accounts for (from a request's arrival to its answer, and the flush rounds and `fdatasync`s
//! under it), so that a slow phase can be told apart: a broker slow inside, a slow disk, or
//! time spent outside the broker. Only for a spawned Strand (its ready file names the admin
//! listener); a peer broker exports other metrics, or none.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::queue_client::HttpConn;

/// The histograms read over a phase: (metric, label that must be present, what to call it).
/// Series that differ in other labels (a shard each) are added together.
const PHASE_HISTOGRAMS: &[(&str, &str, &str)] = &[
    (
        "strand_kafka_request_duration_seconds",
        "api=\"Produce\"",
        "Produce request",
    ),
    (
        "strand_produce_stage_seconds",
        "stage=\"durable\"",
        "durable stage",
    ),
    ("strand_flush_wait_seconds", "", "round wait"),
    ("strand_flush_duration_seconds", "", "flush round"),
    ("strand_direct_fsync_seconds", "", "segment fsync"),
    ("strand_journal_fsync_seconds", "", "journal fsync"),
    // A timer's lateness, probed every 10 ms per shard: a stall that holds up every request
    // (a blocking call, the thread not scheduled) is one sample, so only the maximum shows it.
    ("strand_shard_stall_seconds", "", "shard stall"),
];

/// One scrape: per histogram series (name and labels other than `le`), its cumulative bucket
/// counts by upper bound in seconds (`+Inf` as infinity).
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    series: BTreeMap<(String, String), Vec<(f64, f64)>>,
}

/// A histogram's samples over a phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseHistogram {
    pub name: String,
    /// What it measures, in the report's words.
    pub label: String,
    pub samples: u64,
    /// Upper bounds (µs) of the buckets holding the p50, p99 and p99.9 samples and the largest
    /// one: the quantile is at most this. `None` when it falls in the last, unbounded bucket.
    pub p50_le_us: Option<u64>,
    pub p99_le_us: Option<u64>,
    pub p999_le_us: Option<u64>,
    pub max_le_us: Option<u64>,
}

impl Scrape {
    /// Reads the histogram buckets out of a Prometheus text exposition; other lines are skipped.
    pub fn parse(text: &str) -> Scrape {
        let mut series: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for line in text.lines() {
            let Some((name, rest)) = line.split_once("_bucket{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(count) = value.trim().parse::<f64>() else {
                continue;
            };
            let mut le = None;
            let mut others = Vec::new();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                match pair.strip_prefix("le=") {
                    Some(v) => le = Some(v.trim_matches('"').to_string()),
                    None => others.push(pair),
                }
            }
            let bound = match le.as_deref() {
                Some("+Inf") => f64::INFINITY,
                Some(v) => match v.parse::<f64>() {
                    Ok(b) => b,
                    Err(_) => continue,
                },
                None => continue,
            };
            series
                .entry((name.to_string(), others.join(",")))
                .or_default()
                .push((bound, count));
        }
        for buckets in series.values_mut() {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Scrape { series }
    }

    /// Scrapes `http://{admin}/metrics`.
    pub fn fetch(admin: &str, timeout: Duration) -> Result<Scrape> {
        let mut conn = HttpConn::new(admin);
        conn.set_read_timeout(timeout);
        let response = conn
            .request("GET", "/metrics", None)
            .with_context(|| format!("GET http://{admin}/metrics"))?;
        if response.status != 200 {
            bail!("GET http://{admin}/metrics answered {}", response.status);
        }
        Ok(Scrape::parse(&response.text()))
    }

    /// The bucket counts of `name`'s series carrying `label` (all if empty), added together.
    fn buckets(&self, name: &str, label: &str) -> BTreeMap<u64, (f64, f64)> {
        let mut sum: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for ((n, labels), buckets) in &self.series {
            if n != name || !(label.is_empty() || labels.split(',').any(|l| l == label)) {
                continue;
            }
            for &(bound, count) in buckets {
                sum.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += count;
            }
        }
        sum
    }
}

/// The phase's samples of each of [`PHASE_HISTOGRAMS`] the broker exported: `after` minus
/// `before`. Histograms with no sample in the phase are left out.
pub fn phase_histograms(before: &Scrape, after: &Scrape) -> Vec<PhaseHistogram> {
    let mut out = Vec::new();
    for &(name, label, what) in PHASE_HISTOGRAMS {
        let start = before.buckets(name, label);
        let mut delta: Vec<(f64, f64)> = after
            .buckets(name, label)
            .into_iter()
            .map(|(bits, (bound, count))| (bound, count - start.get(&bits).map_or(0.0, |s| s.1)))
            .collect();
        delta.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = delta.last().map_or(0.0, |d| d.1);
        if total < 1.0 {
            continue;
        }
        let quantile = |q: f64| {
            delta
                .iter()
                .find(|(_, count)| *count >= q * total)
                .and_then(|(bound, _)| bound.is_finite().then(|| (bound * 1e6).round() as u64))
        };
        out.push(PhaseHistogram {
            name: name.to_string(),
            label: what.to_string(),
            samples: total.round() as u64,
            p50_le_us: quantile(0.50),
            p99_le_us: quantile(0.99),
            p999_le_us: quantile(0.999),
            max_le_us: quantile(1.0),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(produce: [u64; 4], fsync_a: [u64; 3], fsync_b: [u64; 3]) -> String {
        let [p1, p2, p3, p4] = produce;
        let [a1, a2, a3] = fsync_a;
        let [b1, b2, b3] = fsync_b;
        format!(
            "# TYPE strand_kafka_request_duration_seconds histogram\n\
             strand_kafka_request_duration_seconds_bucket{{api=\"Produce\",le=\"0.001\"}} {p1}\n\
             strand_kafka_request_duration_seconds_bucket{{api=\"Produce\",le=\"0.005\"}} {p2}\n\
             strand_kafka_request_duration_seconds_bucket{{api=\"Produce\",le=\"0.1\"}} {p3}\n\
             strand_kafka_request_duration_seconds_bucket{{api=\"Produce\",le=\"+Inf\"}} {p4}\n\
             strand_kafka_request_duration_seconds_sum{{api=\"Produce\"}} 1.5\n\
             strand_kafka_request_duration_seconds_count{{api=\"Produce\"}} {p4}\n\
             strand_kafka_request_duration_seconds_bucket{{api=\"Fetch\",le=\"0.001\"}} 900\n\
             strand_kafka_request_duration_seconds_bucket{{api=\"Fetch\",le=\"+Inf\"}} 900\n\
             strand_direct_fsync_seconds_bucket{{shard=\"0\",le=\"0.001\"}} {a1}\n\
             strand_direct_fsync_seconds_bucket{{shard=\"0\",le=\"0.01\"}} {a2}\n\
             strand_direct_fsync_seconds_bucket{{shard=\"0\",le=\"+Inf\"}} {a3}\n\
             strand_direct_fsync_seconds_bucket{{shard=\"1\",le=\"0.001\"}} {b1}\n\
             strand_direct_fsync_seconds_bucket{{shard=\"1\",le=\"0.01\"}} {b2}\n\
             strand_direct_fsync_seconds_bucket{{shard=\"1\",le=\"+Inf\"}} {b3}\n\
             strand_connections{{shard=\"0\"}} 3\n\
             garbage_bucket{{le=\"x\"}} 1\n\
             broken_bucket{{le=\"0.1\"}} nan-ish\n"
        )
    }

    /// Only the phase's samples count, shards add up, other APIs and lines are left out, and
    /// each quantile is its bucket's upper bound.
    #[test]
    fn a_phase_is_the_difference_of_two_scrapes() {
        let before = Scrape::parse(&exposition([10, 10, 10, 10], [5, 5, 5], [0, 0, 0]));
        // Produce: 100 more, 50 ≤ 1 ms, 40 ≤ 5 ms, 9 ≤ 100 ms, 1 beyond.
        // fsync: 100 more over both shards, 98 ≤ 1 ms, 2 ≤ 10 ms.
        let after = Scrape::parse(&exposition([60, 100, 109, 110], [55, 56, 56], [48, 49, 49]));
        let h = phase_histograms(&before, &after);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(
            h[0],
            PhaseHistogram {
                name: "strand_kafka_request_duration_seconds".into(),
                label: "Produce request".into(),
                samples: 100,
                p50_le_us: Some(1_000),
                p99_le_us: Some(100_000),
                p999_le_us: None,
                max_le_us: None,
            }
        );
        assert_eq!(h[1].label, "segment fsync");
        assert_eq!(h[1].samples, 100);
        assert_eq!(
            (h[1].p50_le_us, h[1].p99_le_us, h[1].p999_le_us, h[1].max_le_us),
            (Some(1_000), Some(10_000), Some(10_000), Some(10_000))
        );
    }

    #[test]
    fn nothing_in_the_phase_or_nothing_exported_gives_nothing() {
        let same = Scrape::parse(&exposition([10, 10, 10, 10], [5, 5, 5], [1, 1, 1]));
        assert!(phase_histograms(&same, &same).is_empty());
        assert!(phase_histograms(&Scrape::default(), &Scrape::parse("")).is_empty());
    }
}
