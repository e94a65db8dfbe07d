//! A node's copy of a partition, read from its segment files after the node stopped: the
//! Kafka layout `<log.dirs>/<topic>-<partition>/<base offset, 20 digits>.log`, each file a run
//! of v2 record batches (CRC-checked with `strand_protocol`), the active segment possibly
//! followed by zeros (space reserved ahead of writes).

use std::fs;
use std::path::Path;

use bytes::Bytes;
use strand_protocol::batch::{BatchScanner, ScanStop};
use strand_protocol::records::decode_records;

use super::checker::{NodeNo, Offset, PartitionNo, ReadRecord, ReplicaBatch, ReplicaLog};

/// Most bytes one batch may decompress to (the harness writes uncompressed batches).
const MAX_DECOMPRESSED_BYTES: usize = 64 << 20;

/// Reads `node`'s copy of `topic`'s `partition` under its data directory `data`. A missing
/// directory is a replica with no batches and the problem said.
pub fn read_replica(node: NodeNo, data: &Path, topic: &str, partition: PartitionNo) -> ReplicaLog {
    let dir = data.join(format!("{topic}-{}", partition.0));
    let mut log = ReplicaLog {
        node,
        partition,
        batches: Vec::new(),
        problem: None,
    };
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) => {
            log.problem = Some(format!("{}: {e}", dir.display()));
            return log;
        }
    };
    let mut segments: Vec<(String, std::path::PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .filter(|(name, _)| {
            name.len() == 24 && name.ends_with(".log") && name.as_bytes()[..20].iter().all(u8::is_ascii_digit)
        })
        .collect();
    // Twenty-digit names sort as their base offsets do.
    segments.sort();
    for (name, path) in segments {
        let bytes = match fs::read(&path) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                log.problem = Some(format!("{}: {e}", path.display()));
                return log;
            }
        };
        if let Err(problem) = parse_segment(&bytes, &mut log.batches) {
            log.problem = Some(format!("{name}: {problem}"));
            return log;
        }
    }
    log
}

/// Appends the batches of one segment file's `bytes` to `out`. Zeros after the last batch are
/// reserved space; anything else that does not parse is a problem.
pub fn parse_segment(bytes: &Bytes, out: &mut Vec<ReplicaBatch>) -> Result<(), String> {
    let mut scanner = BatchScanner::new(bytes, true);
    let mut positions = Vec::new();
    for b in scanner.by_ref() {
        positions.push(b);
    }
    let end = scanner.position();
    match scanner.stop() {
        Some(ScanStop::Clean) | None => {}
        Some(ScanStop::Incomplete { position } | ScanStop::Corrupt { position, .. }) => {
            if !bytes[*position..].iter().all(|&b| b == 0) {
                return Err(format!(
                    "batch at byte {position} does not parse (and is not zeros)"
                ));
            }
        }
    }
    debug_assert!(end <= bytes.len());
    for p in positions {
        let batch = bytes.slice(p.position..p.position + p.header.total_bytes());
        let records = decode_records(&batch, MAX_DECOMPRESSED_BYTES)
            .map_err(|e| format!("batch at offset {}: {e}", p.header.base_offset))?
            .into_iter()
            .map(|r| ReadRecord {
                offset: Offset(r.offset),
                value: r.value.map(|v| v.to_vec()),
            })
            .collect();
        out.push(ReplicaBatch {
            base_offset: Offset(p.header.base_offset),
            next_offset: Offset(p.header.next_offset()),
            bytes: batch.to_vec(),
            records,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use strand_protocol::batch::build::{batch, TestRecord};
    use strand_protocol::batch::patch_batch;

    use super::*;

    fn two_batches() -> Vec<u8> {
        let mut a = batch(
            &[TestRecord {
                key: None,
                value: Some(b"a"),
                ..Default::default()
            }],
            1,
        );
        patch_batch(&mut a, 0, 0);
        let mut b = batch(
            &[
                TestRecord {
                    key: None,
                    value: Some(b"b"),
                    ..Default::default()
                },
                TestRecord {
                    key: None,
                    value: Some(b"c"),
                    ..Default::default()
                },
            ],
            1,
        );
        patch_batch(&mut b, 1, 0);
        [a, b].concat()
    }

    #[test]
    fn segments_parse_with_reserved_zeros_and_fail_on_garbage() {
        let mut bytes = two_batches();
        let mut out = Vec::new();
        parse_segment(&Bytes::from(bytes.clone()), &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!((out[1].base_offset, out[1].next_offset), (Offset(1), Offset(3)));
        assert_eq!(out[1].records[1].value.as_deref(), Some(&b"c"[..]));

        bytes.extend([0u8; 4096]);
        out.clear();
        parse_segment(&Bytes::from(bytes.clone()), &mut out).unwrap();
        assert_eq!(out.len(), 2);

        bytes.extend([1u8; 10]);
        assert!(parse_segment(&Bytes::from(bytes), &mut Vec::new()).is_err());
    }

    #[test]
    fn a_replica_is_read_from_its_partition_directory() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let p = dir.path().join("t-3");
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join(format!("{:020}.log", 0)), two_batches()).unwrap();
        fs::write(p.join(format!("{:020}.index", 0)), [0u8; 8]).unwrap();
        let r = read_replica(NodeNo(2), dir.path(), "t", PartitionNo(3));
        assert_eq!(r.problem, None);
        assert_eq!(r.batches.len(), 2);
        let missing = read_replica(NodeNo(2), dir.path(), "t", PartitionNo(4));
        assert!(missing.problem.is_some() && missing.batches.is_empty());
    }
}
