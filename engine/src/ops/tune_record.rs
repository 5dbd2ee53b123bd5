//! The projection timings of earlier starts ([`TuneRecord`]), kept in the
//! kernel cache directory beside CubeCL's autotune results, so that a
//! restart on a filled `--kernel-cache-dir` times nothing
//! (`super::Ops::tune_linear`).
//!
//! Why: CubeCL persists its own autotune results and compiled kernels, but
//! Ember's choice between its decode kernels and cuBLASLt was timed again at
//! every start: per shape with more than one candidate, random inputs, 16
//! eager calls read back, a CUDA graph of 16 calls captured and replayed 5
//! times, each candidate between two device syncs. GPT-2 XL's restart spent
//! 1.6 s of its warmup there for 62 shapes; this record makes that a file
//! read.
//!
//! An entry is keyed by the shape and by the candidates as they are now
//! (their plans, hence the kernel knobs, and whether cuBLASLt loaded), so a
//! changed knob re-times its shapes. The directory is already specific to
//! the GPU, driver, NVRTC and Ember version (`super::cuda::runtime`); the
//! file also names the binary it was timed with (its size and modification
//! time), and a rebuilt binary, whose kernels may have changed, re-times
//! everything once. A missing, unreadable or stale file only costs the
//! timing; a failure to write it is a warning.
//!
//! The format is text, one line a shape: `rows n k lm_head <candidates>`,
//! a tab, then each candidate's microseconds per call.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::choice::{LinearKernel, LinearShape};

/// The record's file name inside the kernel cache directory.
pub const FILE_NAME: &str = "ember-projection-timings.tsv";

/// The first line's prefix; the binary's identity follows.
const HEADER: &str = "# ember projection timings, binary ";

/// Timings of earlier starts by shape (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TuneRecord {
    /// Where it is saved; `None`: kept in memory only.
    path: Option<PathBuf>,
    /// The running binary's identity ([`binary_identity`]).
    binary: String,
    /// Key ([`key`]) -> microseconds per call of each candidate, in order.
    entries: BTreeMap<String, Vec<f64>>,
    /// Whether an entry was added since the file was read.
    changed: bool,
}

impl TuneRecord {
    /// The record in `dir` (none yet, or made by another binary: empty),
    /// for the running binary. `None`: no directory, nothing saved.
    pub fn open(dir: Option<&Path>) -> Self {
        let binary = binary_identity();
        let Some(dir) = dir else {
            return Self {
                binary,
                ..Self::default()
            };
        };
        let path = dir.join(FILE_NAME);
        let entries = match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text, &binary),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the projection timings; timing again");
                BTreeMap::new()
            }
        };
        tracing::debug!(path = %path.display(), entries = entries.len(), "projection timings of earlier starts");
        Self {
            path: Some(path),
            binary,
            entries,
            changed: false,
        }
    }

    /// The recorded timings of `candidates` at `shape`, in their order, if
    /// every one of them was timed with these very candidates.
    pub fn timings(
        &self,
        shape: LinearShape,
        candidates: &[LinearKernel],
    ) -> Option<Vec<(LinearKernel, f64)>> {
        let us = self.entries.get(&key(shape, candidates))?;
        (us.len() == candidates.len())
            .then(|| candidates.iter().copied().zip(us.iter().copied()).collect())
    }

    /// Records `timings` of `candidates` at `shape`; only a complete set
    /// (a candidate that could not be timed is timed again next start).
    pub fn record(
        &mut self,
        shape: LinearShape,
        candidates: &[LinearKernel],
        timings: &[(LinearKernel, f64)],
    ) {
        let complete = timings.len() == candidates.len()
            && timings
                .iter()
                .zip(candidates)
                .all(|((k, us), c)| k == c && us.is_finite());
        if complete {
            let us = timings.iter().map(|&(_, us)| us).collect();
            self.entries.insert(key(shape, candidates), us);
            self.changed = true;
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Writes the record if an entry was added (a temporary file renamed
    /// over the old one, so a concurrent start reads one or the other).
    pub fn save(&self) {
        let (Some(path), true) = (&self.path, self.changed) else {
            return;
        };
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written =
            std::fs::write(&tmp, self.render()).and_then(|()| std::fs::rename(&tmp, path));
        match written {
            Ok(()) => {
                tracing::debug!(path = %path.display(), entries = self.entries.len(), "projection timings saved")
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                tracing::warn!(path = %path.display(), error = %e, "cannot save the projection timings; the next start times them again");
            }
        }
    }

    /// The file's text.
    fn render(&self) -> String {
        let mut out = format!("{HEADER}{}\n", self.binary);
        for (key, us) in &self.entries {
            let us: Vec<String> = us.iter().map(|t| format!("{t:.3}")).collect();
            out.push_str(&format!("{key}\t{}\n", us.join(" ")));
        }
        out
    }
}

/// The entries of a record's text, if it was made by `binary` (else none).
fn parse(text: &str, binary: &str) -> BTreeMap<String, Vec<f64>> {
    let mut lines = text.lines();
    if lines.next().and_then(|l| l.strip_prefix(HEADER)) != Some(binary) {
        return BTreeMap::new();
    }
    lines
        .filter_map(|line| {
            let (key, us) = line.split_once('\t')?;
            let us: Option<Vec<f64>> = us.split(' ').map(|t| t.parse().ok()).collect();
            Some((key.to_string(), us?))
        })
        .collect()
}

/// An entry's key: the shape and the candidates as they are now.
fn key(shape: LinearShape, candidates: &[LinearKernel]) -> String {
    let LinearShape {
        rows,
        n,
        k,
        lm_head,
    } = shape;
    format!("{rows} {n} {k} {lm_head} {candidates:?}")
}

/// The running binary: its path, size and modification time (nanoseconds
/// since the epoch); `unknown` when it cannot be read (then every start
/// matches every other, as before this record existed: a stale choice at
/// worst, never a wrong result).
fn binary_identity() -> String {
    let read = || -> std::io::Result<String> {
        let exe = std::env::current_exe()?;
        let meta = std::fs::metadata(&exe)?;
        let modified = meta
            .modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Ok(format!("{} {} {modified}", exe.display(), meta.len()))
    };
    read().unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::plan::LinearPlan;

    fn shape(rows: usize) -> LinearShape {
        LinearShape {
            rows,
            n: 4800,
            k: 1600,
            lm_head: false,
        }
    }

    const MMA: LinearKernel = LinearKernel::Ember(LinearPlan::Mma {
        row_tiles: 1,
        warps: 4,
    });

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ember-tune-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_saved_record_answers_the_next_start_with_the_same_candidates_only() {
        let dir = temp_dir("roundtrip");
        let both = [MMA, LinearKernel::Lt];
        let mut first = TuneRecord::open(Some(&dir));
        assert!(first.is_empty());
        assert_eq!(first.timings(shape(8), &both), None);
        first.record(shape(8), &both, &[(MMA, 12.5), (LinearKernel::Lt, 20.25)]);
        first.save();
        let again = TuneRecord::open(Some(&dir));
        assert_eq!(again.len(), 1);
        assert_eq!(
            again.timings(shape(8), &both),
            Some(vec![(MMA, 12.5), (LinearKernel::Lt, 20.25)])
        );
        // Another shape, or other candidates (a knob changed the plan,
        // cuBLASLt missing): not recorded.
        assert_eq!(again.timings(shape(16), &both), None);
        assert_eq!(
            again.timings(
                shape(8),
                &[LinearKernel::Ember(LinearPlan::Gemv), LinearKernel::Lt]
            ),
            None
        );
        assert_eq!(again.timings(shape(8), &[MMA]), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn incomplete_timings_and_other_binaries_are_not_trusted() {
        let both = [MMA, LinearKernel::Lt];
        let mut record = TuneRecord::open(None);
        record.record(shape(8), &both, &[(LinearKernel::Lt, 3.0)]);
        record.record(shape(8), &both, &[(MMA, f64::NAN), (LinearKernel::Lt, 3.0)]);
        assert!(record.is_empty());
        record.record(shape(8), &both, &[(MMA, 1.0), (LinearKernel::Lt, 3.0)]);
        let text = record.render();
        assert_eq!(parse(&text, &record.binary).len(), 1);
        assert!(parse(&text, "another binary").is_empty());
        assert!(parse("", &record.binary).is_empty());
        // A damaged line is skipped, the rest kept.
        let damaged = format!("{text}garbage\n1 2 3 false [Lt]\tx\n");
        assert_eq!(parse(&damaged, &record.binary).len(), 1);
    }

    #[test]
    fn nothing_is_written_without_a_new_entry_or_a_directory() {
        let dir = temp_dir("unchanged");
        TuneRecord::open(Some(&dir)).save();
        assert!(!dir.join(FILE_NAME).exists());
        let mut memory = TuneRecord::open(None);
        memory.record(shape(1), &[MMA], &[(MMA, 1.0)]);
        memory.save();
        assert!(!dir.join(FILE_NAME).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
