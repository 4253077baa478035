//! Polling for an edit to files on disk, taken only once it holds still: the one
//! settle-and-reload mechanism behind the config and rules-file watchers.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the watched files are read.
const POLL: Duration = Duration::from_secs(1);
/// How long a changed read must stay the same before it is taken: a file caught mid-write (not
/// renamed into place whole) reads differently a moment later.
const SETTLE: Duration = Duration::from_millis(150);

/// Reads with `read` every [`POLL`] for a read that differs from the last one handed over and
/// holds still for [`SETTLE`]. A loop on [`Watch::next`] is the reload: a callback would be
/// an async closure, whose future cannot be proven `Send` for `tokio::spawn`.
pub(crate) struct Watch<T, R> {
    read: R,
    last: Option<T>,
    interval: tokio::time::Interval,
}

impl<T, E, R> Watch<T, R>
where
    T: PartialEq + Clone,
    R: FnMut() -> Result<T, E>,
{
    /// Watches what `read` reads, `last` being what is running now.
    pub(crate) fn new(last: T, read: R) -> Self {
        let mut interval = tokio::time::interval(POLL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            read,
            last: Some(last),
            interval,
        }
    }

    /// The next settled read that differs from the last one handed over, so a bad edit is
    /// answered once. A failed read is handed over at once, only the first of a run; the next
    /// good read then counts as a change.
    pub(crate) async fn next(&mut self) -> Result<T, E> {
        loop {
            self.interval.tick().await;
            let now = match (self.read)() {
                Ok(now) => now,
                Err(e) => {
                    if self.last.take().is_some() {
                        return Err(e);
                    }
                    continue;
                }
            };
            if self.last.as_ref() == Some(&now) {
                continue;
            }
            // Not settled: the next poll looks again.
            let Some(now) = settled(&mut self.read, now, SETTLE).await else {
                continue;
            };
            self.last = Some(now.clone());
            return Ok(now);
        }
    }
}

/// `first` if a second read `settle` later reads the same; `None` if it changed or failed.
async fn settled<T: PartialEq, E>(
    read: &mut impl FnMut() -> Result<T, E>,
    first: T,
    settle: Duration,
) -> Option<T> {
    tokio::time::sleep(settle).await;
    match read() {
        Ok(again) if again == first => Some(first),
        _ => None,
    }
}

/// The bytes of every file under `path` (itself if a file), by name: what a change to a
/// directory is told by. Unreadable entries are left out.
pub(crate) fn contents(path: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    collect(path, &mut files, 0);
    files.sort();
    files
}

fn collect(path: &Path, files: &mut Vec<(PathBuf, Vec<u8>)>, depth: usize) {
    // As deep as any rules directory needs; a link loop ends here.
    if depth > 8 {
        return;
    }
    if path.is_dir() {
        if let Ok(entries) = std::fs::read_dir(path) {
            for entry in entries.flatten() {
                collect(&entry.path(), files, depth + 1);
            }
        }
    } else if let Ok(bytes) = std::fs::read(path) {
        files.push((path.to_path_buf(), bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file still being written when first read is not taken; one that holds still is.
    /// Paused time orders the writer's step between the two reads.
    #[tokio::test(start_paused = true)]
    async fn a_file_caught_mid_write_is_not_taken_until_it_holds_still() {
        let dir = std::env::temp_dir().join(format!("sluice-settle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sluice.yaml");
        let mut read = || std::fs::read(&file);
        std::fs::write(&file, "accounts:\n  alice: 1/").unwrap();
        let first = std::fs::read(&file).unwrap();
        let writer = {
            let file = file.clone();
            tokio::spawn(async move {
                tokio::time::sleep(SETTLE / 3).await;
                std::fs::write(&file, "accounts:\n  alice: 1/h\n").unwrap();
            })
        };
        assert_eq!(settled(&mut read, first, SETTLE).await, None);
        writer.await.unwrap();
        let whole = std::fs::read(&file).unwrap();
        assert_eq!(settled(&mut read, whole.clone(), SETTLE).await, Some(whole));
        std::fs::remove_file(&file).unwrap();
        assert_eq!(settled(&mut read, b"gone".to_vec(), SETTLE).await, None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
