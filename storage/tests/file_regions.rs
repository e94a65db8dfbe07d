//! The bound on file regions alive at once (`FileRegions`), which the broker creates once and
//! shares among its shards.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use futures_lite::future::block_on;
use strand_protocol::batch::build;
use strand_storage::fs_mem::MemFs;
use strand_storage::{FileRegion, FileRegions, LogConfig, LogKey, ReadData, ShardStore, StoreConfig};

fn one_record_batch(value_bytes: usize) -> Vec<u8> {
    let value = vec![7u8; value_bytes];
    let rec = build::TestRecord {
        key: None,
        value: Some(&value),
        headers: vec![],
        timestamp_delta: 0,
    };
    build::batch(&[rec], 0)
}

/// Regions past the bound are refused, so a read copies its bytes instead of holding one more
/// descriptor; one given back makes room for the next.
#[test]
fn file_regions_alive_at_once_are_bounded_and_reads_copy_past_the_bound() {
    block_on(async {
        let bound = FileRegions::for_process(FileRegions::open_files_share());
        let fs = MemFs::new();
        fs.set_sendable(Some(bound));
        let store = ShardStore::open(
            fs.clone(),
            PathBuf::from("/data"),
            0,
            StoreConfig {
                journal_segment_bytes: 64 << 20,
                ..StoreConfig::default()
            },
        )
        .await
        .unwrap();
        let key = LogKey {
            dir_name: "regions-0".to_owned(),
            incarnation: [3; 16],
        };
        let config = LogConfig {
            segment_bytes: 8 << 20,
            segment_ms: i64::MAX / 4,
            retention_ms: None,
            retention_bytes: None,
            index_interval_bytes: 4096,
            max_index_entries: 1000,
        };
        let (id, _) = store.open_log(key, config, 0).await.unwrap();
        for _ in 0..8 {
            store.append(id, &one_record_batch(40_000), 0, 0).unwrap();
        }
        store.flush_round().await;
        let read = || async {
            let plan = store.plan_read(id, 0, 1 << 20).unwrap().unwrap();
            plan.execute_sendable(64 << 10).await.unwrap()
        };

        let first = read().await;
        assert!(matches!(first, ReadData::Region(_)), "no region below the bound");
        assert_eq!(bound.alive(), 1);
        drop(first);
        assert_eq!(bound.alive(), 0, "a dropped region kept its slot");

        let max = bound.max();
        assert!((16..=4096).contains(&max), "{max} slots");
        let file: OwnedFd = tempfile::tempfile().unwrap().into();
        let mut held: Vec<FileRegion> = (0..max)
            .map(|i| {
                bound
                    .region(file.try_clone().unwrap(), i as u64, 1)
                    .unwrap_or_else(|| panic!("region {i} of {max} refused"))
            })
            .collect();
        assert_eq!(bound.alive(), max);
        assert!(
            bound.region(file.try_clone().unwrap(), 0, 1).is_none(),
            "a region past the bound"
        );
        match read().await {
            ReadData::Bytes(b) => assert!(b.len() > 64 << 10, "{} bytes", b.len()),
            ReadData::Region(_) => panic!("a read at the bound held one more descriptor"),
        }
        held.pop();
        assert!(
            matches!(read().await, ReadData::Region(_)),
            "no region once one was given back"
        );
        drop(held);
        assert_eq!(bound.alive(), 0);
    });
}
