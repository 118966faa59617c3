//! Remembered autotuning winners: which candidate configuration of a kernel ran fastest on a
//! device, keyed by the device's codegen [`Target`] and the kernel's default source (so any change
//! to the kernel, to codegen or to the GPU forgets the old winner). Stored as one small JSON file beside the kernel cache;
//! an unreadable file is warned about once and replaced on the next write.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::sync::Once;

use braze_codegen::{KernelCode, KernelConfig, Target};
use braze_plan::Plan;
use sha2::{Digest, Sha256};

use crate::cache::KernelCache;

const FILE_NAME: &str = "autotune.json";

/// What tuning one kernel found.
#[derive(Clone, Debug)]
pub struct AutotuneRecord {
    pub kernel: String,
    pub winner: String,
    /// Index into `braze_codegen::candidate_configs` for this kernel.
    pub winner_index: usize,
    /// Median milliseconds of each candidate that ran.
    pub timings_ms: Vec<(String, f32)>,
}

pub struct AutotuneStore {
    path: PathBuf,
}

static CORRUPT_WARNING: Once = Once::new();

impl AutotuneStore {
    /// The store beside the default kernel cache, or `None` when there is no cache directory.
    pub fn open_default() -> Option<AutotuneStore> {
        KernelCache::default_dir().map(|dir| AutotuneStore { path: dir.join(FILE_NAME) })
    }

    pub fn at(path: impl Into<PathBuf>) -> AutotuneStore {
        AutotuneStore { path: path.into() }
    }

    fn key(target: &Target, plan: &Plan, kernel: usize) -> Option<String> {
        let default = braze_codegen::default_config(plan, kernel, target);
        // A matmul's algorithm ranks are the library's for the problem, so its key is the
        // problem and the library's version.
        let source = match braze_codegen::generate(plan, kernel, &default, target).ok()? {
            KernelCode::Cuda(g) => g.source,
            KernelCode::CuBlasLt(matmul) => format!("cuBLASLt {} {matmul:?}", crate::blas::library_version()?),
        };
        let mut hash = Sha256::new();
        hash.update(format!("{target:?}").as_bytes());
        hash.update([0]);
        hash.update(source.as_bytes());
        Some(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }

    fn read(&self) -> BTreeMap<String, usize> {
        let Ok(text) = fs::read_to_string(&self.path) else { return BTreeMap::new() };
        match parse(&text) {
            Some(map) => map,
            None => {
                CORRUPT_WARNING.call_once(|| {
                    tracing::warn!(target: "braze::autotune", path = %self.path.display(),
                        "autotune file is unreadable; ignoring it (it is rewritten on the next tuning)")
                });
                BTreeMap::new()
            }
        }
    }

    /// The remembered winner for kernel `kernel` of `plan` on `target`.
    pub fn lookup(&self, target: &Target, plan: &Plan, kernel: usize) -> Option<KernelConfig> {
        let key = Self::key(target, plan, kernel)?;
        let index = *self.read().get(&key)?;
        braze_codegen::candidate_configs(plan, kernel, target).get(index).copied()
    }

    /// Records a winner; failures to write are warned about, never fatal.
    pub fn remember(&self, target: &Target, plan: &Plan, kernel: usize, index: usize) {
        let Some(key) = Self::key(target, plan, kernel) else { return };
        let mut map = self.read();
        map.insert(key, index);
        let text = render(&map);
        let tmp = self.path.with_extension(format!("json.tmp{}", std::process::id()));
        let written = fs::create_dir_all(self.path.parent().unwrap_or(&self.path))
            .and_then(|_| fs::write(&tmp, text))
            .and_then(|_| fs::rename(&tmp, &self.path));
        if let Err(err) = written {
            let _ = fs::remove_file(&tmp);
            tracing::warn!(target: "braze::autotune", path = %self.path.display(), error = %err, "could not save autotune winners");
        }
    }
}

/// `{"<hex key>": <index>, ...}`: a flat object of unsigned integers.
fn render(map: &BTreeMap<String, usize>) -> String {
    let body: Vec<String> = map.iter().map(|(k, v)| format!("  \"{k}\": {v}")).collect();
    format!("{{\n{}\n}}\n", body.join(",\n"))
}

fn parse(text: &str) -> Option<BTreeMap<String, usize>> {
    let inner = text.trim().strip_prefix('{')?.strip_suffix('}')?;
    let mut map = BTreeMap::new();
    for entry in inner.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, value) = entry.split_once(':')?;
        let key = key.trim().strip_prefix('"')?.strip_suffix('"')?;
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        map.insert(key.to_string(), value.trim().parse().ok()?);
    }
    Some(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_format_round_trips_and_rejects_garbage() {
        let mut map = BTreeMap::new();
        map.insert("ab12".to_string(), 3);
        map.insert("ff00".to_string(), 0);
        assert_eq!(parse(&render(&map)), Some(map));
        assert_eq!(parse("{}"), Some(BTreeMap::new()));
        assert_eq!(parse("{\"ab\": 3"), None);
        assert_eq!(parse("{\"zz\": 3}"), None);
        assert_eq!(parse("{\"ab\": -1}"), None);
    }
}
