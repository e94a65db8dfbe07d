//! [`Fs`] on glommio: file reads, writes and `fdatasync` go through the shard's io_uring, so a
//! shard keeps serving while its flush round waits for the disk. Directory operations are rare
//! (segment roll, topic creation) and use blocking `std::fs` calls.
//!
//! This is the only storage module that knows the runtime.

use std::io;
use std::path::Path;

use bytes::Bytes;
use glommio::io::{BufferedFile, OpenOptions};

use crate::fs::{FileHandle, Fs, StdFs};

/// The glommio-backed file system; usable only inside a glommio executor.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlommioFs;

/// A glommio buffered file (page cache, io_uring).
#[derive(Debug)]
pub struct GlommioFile(BufferedFile);

impl FileHandle for GlommioFile {
    async fn write_all_at(&self, buf: Vec<u8>, pos: u64) -> io::Result<()> {
        let len = buf.len();
        let n = self.0.write_at(buf, pos).await?;
        if n < len {
            // Regular-file writes come back short only when the disk or a file-size limit runs
            // out mid-write; glommio has taken the buffer, so report it as the error it is.
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("short write: {n} of {len} bytes at position {pos}"),
            ));
        }
        Ok(())
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let r = self.0.read_at(pos + out.len() as u64, len - out.len()).await?;
            if r.is_empty() {
                break;
            }
            out.extend_from_slice(&r);
        }
        Ok(Bytes::from(out))
    }

    async fn fdatasync(&self) -> io::Result<()> {
        Ok(self.0.fdatasync().await?)
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        Ok(self.0.truncate(len).await?)
    }

    async fn size(&self) -> io::Result<u64> {
        Ok(self.0.file_size().await?)
    }
}

impl Fs for GlommioFs {
    type File = GlommioFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<GlommioFile> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .buffered_open(path)
            .await?;
        Ok(GlommioFile(f))
    }

    // Directory operations are rare (segment roll, topic creation): blocking std calls.
    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        StdFs.create_dir_all(path).await
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        StdFs.remove_file(path).await
    }

    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        StdFs.remove_dir_all(path).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        StdFs.rename(from, to).await
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        StdFs.list_dir(path).await
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let dir = glommio::io::Directory::open(path).await?;
        dir.sync().await?;
        Ok(dir.close().await?)
    }

    async fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        StdFs.sync_filesystem(path).await
    }

    async fn exists(&self, path: &Path) -> bool {
        StdFs.exists(path).await
    }
}
