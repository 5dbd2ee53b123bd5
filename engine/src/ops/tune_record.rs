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
//! An entry is keyed by the binary that timed it, the shape and the
//! candidates as they are now (their plans, hence the kernel knobs, and
//! whether cuBLASLt loaded), so a changed knob re-times its shapes. The
//! directory is already specific to the GPU, driver, NVRTC and Ember
//! version (`super::cuda::runtime`); the binary is named by its path, size
//! and modification time, so a rebuilt binary, whose kernels may have
//! changed, re-times everything once, and the server and the benchmark
//! sharing a directory keep their own entries. Entries of a binary that is
//! gone or was rebuilt are dropped when the file is read. A missing,
//! unreadable or stale file only costs the timing; a failure to write it
//! is a warning.
//!
//! The format is text, one line a shape: the binary, a tab, `rows n k
//! lm_head <candidates>`, a tab, then each candidate's microseconds per
//! call; lines starting with `#` are comments.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::choice::{LinearKernel, LinearShape};

/// The record's file name inside the kernel cache directory.
pub const FILE_NAME: &str = "ember-projection-timings.tsv";

/// The file's first line.
const HEADER: &str = "# binary\trows n k lm_head candidates\tmicroseconds per call of each";

/// Timings of earlier starts by shape (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TuneRecord {
    /// Where it is saved; `None`: kept in memory only.
    path: Option<PathBuf>,
    /// The running binary's identity ([`binary_identity`]).
    binary: String,
    /// (binary, key ([`key`])) -> microseconds per call of each
    /// candidate, in order.
    entries: BTreeMap<(String, String), Vec<f64>>,
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
            Ok(text) => parse(&text, &binary, still_current),
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
        let us = self
            .entries
            .get(&(self.binary.clone(), key(shape, candidates)))?;
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
            let key = (self.binary.clone(), key(shape, candidates));
            self.entries.insert(key, us);
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
        let mut out = format!("{HEADER}\n");
        for ((binary, key), us) in &self.entries {
            let us: Vec<String> = us.iter().map(|t| format!("{t:.3}")).collect();
            out.push_str(&format!("{binary}\t{key}\t{}\n", us.join(" ")));
        }
        out
    }
}

/// The entries of a record's text: those of `binary`, and of every other
/// binary `current` says is still the one that timed them (damaged lines
/// skipped).
fn parse(
    text: &str,
    binary: &str,
    current: impl Fn(&str) -> bool,
) -> BTreeMap<(String, String), Vec<f64>> {
    let mut live: BTreeMap<&str, bool> = BTreeMap::new();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let (who, key, us) = (fields.next()?, fields.next()?, fields.next()?);
            let us: Option<Vec<f64>> = us.split(' ').map(|t| t.parse().ok()).collect();
            Some((who, key, us?))
        })
        .filter(|(who, _, _)| *who == binary || *live.entry(who).or_insert_with(|| current(who)))
        .map(|(who, key, us)| ((who.to_string(), key.to_string()), us))
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
/// since the epoch); `unknown` when it cannot be read (then every such start
/// shares the entries, as before this record existed: a stale choice at
/// worst, never a wrong result).
fn binary_identity() -> String {
    std::env::current_exe()
        .and_then(|exe| identity_of(&exe))
        .unwrap_or_else(|_| "unknown".into())
}

/// `path`'s identity as [`binary_identity`] writes it.
fn identity_of(path: &Path) -> std::io::Result<String> {
    let meta = std::fs::metadata(path)?;
    let modified = meta
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Ok(format!("{} {} {modified}", path.display(), meta.len()))
}

/// Whether the binary named by `identity` is still there, unchanged.
fn still_current(identity: &str) -> bool {
    let path = identity.rsplitn(3, ' ').nth(2);
    path.is_some_and(|p| identity_of(Path::new(p)).is_ok_and(|now| now == identity))
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
    fn incomplete_timings_are_not_kept_and_damaged_lines_are_skipped() {
        let both = [MMA, LinearKernel::Lt];
        let mut record = TuneRecord::open(None);
        record.record(shape(8), &both, &[(LinearKernel::Lt, 3.0)]);
        record.record(shape(8), &both, &[(MMA, f64::NAN), (LinearKernel::Lt, 3.0)]);
        assert!(record.is_empty());
        record.record(shape(8), &both, &[(MMA, 1.0), (LinearKernel::Lt, 3.0)]);
        let text = record.render();
        let none = |_: &str| false;
        assert_eq!(parse(&text, &record.binary, none).len(), 1);
        assert!(parse("", &record.binary, none).is_empty());
        let damaged = format!("{text}garbage\n{}\t1 2 3 false [Lt]\tx\n", record.binary);
        assert_eq!(parse(&damaged, &record.binary, none).len(), 1);
    }

    #[test]
    fn other_binaries_keep_their_entries_until_rebuilt_or_gone() {
        let dir = temp_dir("binaries");
        let other = dir.join("ember-engine-bench");
        std::fs::write(&other, b"v1").unwrap();
        let theirs = identity_of(&other).unwrap();
        let mut record = TuneRecord::open(None);
        record.record(
            shape(8),
            &[MMA, LinearKernel::Lt],
            &[(MMA, 1.0), (LinearKernel::Lt, 3.0)],
        );
        let line = format!("{theirs}\t8 4800 1600 false [Lt]\t2.000\n");
        let text = format!("{}{line}", record.render());
        // Another binary's entry is kept while it is unchanged, and never
        // answers this binary's lookups.
        let parsed = parse(&text, &record.binary, still_current);
        assert_eq!(parsed.len(), 2);
        record.entries = parsed;
        assert_eq!(record.timings(shape(8), &[LinearKernel::Lt]), None);
        // Rebuilt (another size): dropped.
        std::fs::write(&other, b"version 2").unwrap();
        assert_eq!(parse(&text, &record.binary, still_current).len(), 1);
        std::fs::remove_file(&other).unwrap();
        assert_eq!(parse(&text, &record.binary, still_current).len(), 1);
        assert!(!still_current("no such binary"));
        std::fs::remove_dir_all(&dir).unwrap();
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
