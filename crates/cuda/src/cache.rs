//! Compiled-kernel cache: in memory per process, and content-addressed on disk across processes.
//!
//! NVRTC takes tens of milliseconds per kernel (seconds with heavy headers), so a program that
//! compiles the same generated kernels on every start pays that each time. Entries are keyed by
//! a SHA-256 of everything that determines the compiler output (source, program name, NVRTC
//! version, architecture and options), so a key never needs invalidating: a change in any input
//! is a different key.
//!
//! On-disk entry layout (little endian):
//!
//! | bytes | field |
//! | --- | --- |
//! | 8 | magic `BRZKRNL\0` |
//! | 4 | format version |
//! | 8 | payload length |
//! | 32 | SHA-256 of the payload |
//! | n | payload: key, image kind, compile time, image, log, resources |
//!
//! Entries are written to a temporary file in the same directory and renamed into place, so a
//! reader never sees a half-written entry even with several processes writing the same key. A
//! truncated or corrupt entry (bad magic, length or checksum) is removed, recompiled and
//! rewritten, with one warning per entry per process on the `braze::cache` target.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::error::{CudaError, Result};
use crate::nvrtc::{self, CompileOptions, CompiledModule, ImageKind, KernelResources};

const MAGIC: &[u8; 8] = b"BRZKRNL\0";
/// Bumped whenever the entry layout or the key derivation changes.
const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 8 + 4 + 8 + 32;
/// Name of the entry directory inside the cache root, versioned so that old layouts never
/// collide with new ones.
const ENTRY_DIR: &str = "kernels-v1";
/// Temporary files older than this are left over from a crashed writer and are removed.
const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

/// SHA-256 identifying one compilation; also the entry's file name (in hex).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey([u8; 32]);

impl CacheKey {
    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({self})")
    }
}

/// Counters for tests and diagnostics ("the second process made no NVRTC call").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from this process's memory.
    pub memory_hits: u64,
    /// Lookups answered from a valid on-disk entry.
    pub disk_hits: u64,
    /// NVRTC compilations performed.
    pub compiles: u64,
    /// On-disk entries found truncated or corrupt (and replaced).
    pub corrupt_entries: u64,
    /// Entries that could not be written to disk (the compiled module was still returned).
    pub write_failures: u64,
}

/// Compiled kernels by content, shared across threads (`&self` methods) and, through the disk
/// directory, across processes.
#[derive(Debug)]
pub struct KernelCache {
    /// Directory holding the entry files; `None` keeps the cache in memory only.
    entry_dir: Option<PathBuf>,
    memory: Mutex<HashMap<CacheKey, Arc<CompiledModule>>>,
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    compiles: AtomicU64,
    corrupt_entries: AtomicU64,
    write_failures: AtomicU64,
}

impl KernelCache {
    /// A cache in the default directory (see [`KernelCache::default_dir`]), or memory only when
    /// no directory can be determined. Fails if the directory exists but cannot be created.
    pub fn new() -> Result<Self> {
        match Self::default_dir() {
            Some(dir) => Self::with_dir(dir),
            None => Ok(Self::in_memory()),
        }
    }

    /// A cache rooted at `dir` (created if missing); tests pass temporary directories.
    pub fn with_dir(dir: impl Into<PathBuf>) -> Result<Self> {
        let entry_dir = dir.into().join(ENTRY_DIR);
        fs::create_dir_all(&entry_dir).map_err(|err| CudaError::Cache {
            path: entry_dir.clone(),
            reason: format!("cannot create cache directory: {err}"),
        })?;
        remove_stale_temp_files(&entry_dir);
        Ok(Self::build(Some(entry_dir)))
    }

    /// A cache that never touches the disk.
    pub fn in_memory() -> Self {
        Self::build(None)
    }

    fn build(entry_dir: Option<PathBuf>) -> Self {
        KernelCache {
            entry_dir,
            memory: Mutex::new(HashMap::new()),
            memory_hits: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            compiles: AtomicU64::new(0),
            corrupt_entries: AtomicU64::new(0),
            write_failures: AtomicU64::new(0),
        }
    }

    /// `BRAZE_CACHE_DIR`, else `$XDG_CACHE_HOME/braze`, else `~/.cache/braze`.
    pub fn default_dir() -> Option<PathBuf> {
        let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(dir) = non_empty("BRAZE_CACHE_DIR") {
            return Some(PathBuf::from(dir));
        }
        if let Some(dir) = non_empty("XDG_CACHE_HOME") {
            return Some(PathBuf::from(dir).join("braze"));
        }
        non_empty("HOME").map(|home| PathBuf::from(home).join(".cache").join("braze"))
    }

    /// The directory entry files live in, if this cache uses the disk.
    pub fn entry_dir(&self) -> Option<&Path> {
        self.entry_dir.as_deref()
    }

    /// The key a compilation of `source` as `name` with `opts` is stored under.
    pub fn key(source: &str, name: &str, opts: &CompileOptions) -> Result<CacheKey> {
        let (major, minor) = nvrtc::nvrtc_version()?;
        let args = opts.nvrtc_args()?;
        let mut hasher = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        field(b"braze-kernel-cache");
        field(&FORMAT_VERSION.to_le_bytes());
        field(&major.to_le_bytes());
        field(&minor.to_le_bytes());
        field(name.as_bytes());
        field(&(args.len() as u64).to_le_bytes());
        for arg in &args {
            field(arg.as_bytes());
        }
        field(source.as_bytes());
        Ok(CacheKey(hasher.finalize().into()))
    }

    /// Where the entry for `key` lives on disk.
    pub fn entry_path(&self, key: &CacheKey) -> Option<PathBuf> {
        self.entry_dir.as_ref().map(|dir| dir.join(format!("{key}.bin")))
    }

    /// The compiled module for `source`, from memory, else from disk, else compiled with NVRTC
    /// (and then stored in both). Compile errors are returned and not cached.
    pub fn get_or_compile(&self, source: &str, name: &str, opts: &CompileOptions) -> Result<Arc<CompiledModule>> {
        let key = Self::key(source, name, opts)?;
        if let Some(module) = self.lock_memory().get(&key) {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(module.clone());
        }

        let path = self.entry_path(&key);
        if let Some(path) = &path {
            if let Some(module) = self.read_disk(&key, path) {
                self.disk_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(self.remember(key, module));
            }
        }

        let module = nvrtc::compile(source, name, opts)?;
        self.compiles.fetch_add(1, Ordering::Relaxed);
        if let Some(path) = &path {
            if let Err(err) = write_entry(path, &key, &module) {
                self.write_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    target: "braze::cache",
                    path = %path.display(),
                    error = %err,
                    "could not write kernel cache entry; continuing without it"
                );
            }
        }
        Ok(self.remember(key, module))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            compiles: self.compiles.load(Ordering::Relaxed),
            corrupt_entries: self.corrupt_entries.load(Ordering::Relaxed),
            write_failures: self.write_failures.load(Ordering::Relaxed),
        }
    }

    fn lock_memory(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Arc<CompiledModule>>> {
        // The map holds only finished entries, so it is consistent even if a holder panicked.
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `module` in memory unless another thread got there first; either way returns the
    /// one instance all callers share.
    fn remember(&self, key: CacheKey, module: CompiledModule) -> Arc<CompiledModule> {
        self.lock_memory().entry(key).or_insert_with(|| Arc::new(module)).clone()
    }

    /// A valid entry from disk, or `None` (missing, or invalid and now removed).
    fn read_disk(&self, key: &CacheKey, path: &Path) -> Option<CompiledModule> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return None,
            Err(err) => {
                warn_once(path, &format!("unreadable: {err}"));
                return None;
            }
        };
        match decode_entry(&bytes, key) {
            Ok(module) => Some(module),
            Err(reason) => {
                self.corrupt_entries.fetch_add(1, Ordering::Relaxed);
                warn_once(path, &reason);
                // Another process may have replaced it with a good entry meanwhile; removing
                // that costs one recompile and is harmless.
                let _ = fs::remove_file(path);
                None
            }
        }
    }
}

/// Logs a problem with a cache entry, once per entry per process.
fn warn_once(path: &Path, reason: &str) {
    static WARNED: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let first_time =
        WARNED.get_or_init(Default::default).lock().unwrap_or_else(PoisonError::into_inner).insert(path.to_path_buf());
    if first_time {
        tracing::warn!(
            target: "braze::cache",
            path = %path.display(),
            reason,
            "invalid kernel cache entry removed; recompiling"
        );
    }
}

fn remove_stale_temp_files(entry_dir: &Path) {
    let Ok(entries) = fs::read_dir(entry_dir) else {
        return;
    };
    let now = SystemTime::now();
    for entry in entries.flatten() {
        let is_temp = entry.file_name().to_str().is_some_and(|n| n.starts_with('.') && n.ends_with(".tmp"));
        let is_old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| now.duration_since(modified).ok())
            .is_some_and(|age| age > STALE_TEMP_AGE);
        if is_temp && is_old {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Writes an entry atomically: a unique temporary file in the same directory, flushed, then
/// renamed over `path`.
pub(crate) fn write_entry(path: &Path, key: &CacheKey, module: &CompiledModule) -> io::Result<()> {
    static WRITE_COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir =
        path.parent().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "entry path has no directory"))?;
    let temp = dir.join(format!(".{key}.{}.{}.tmp", std::process::id(), WRITE_COUNTER.fetch_add(1, Ordering::Relaxed)));
    let bytes = encode_entry(key, module);
    let written = (|| {
        let mut file = fs::File::create(&temp)?;
        file.write_all(&bytes)?;
        file.sync_data()?;
        drop(file);
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written
}

pub(crate) fn encode_entry(key: &CacheKey, module: &CompiledModule) -> Vec<u8> {
    let mut payload = Vec::with_capacity(module.image.len() + module.log.len() + 128);
    payload.extend_from_slice(&key.0);
    payload.push(match module.kind {
        ImageKind::Cubin => 0,
        ImageKind::Ptx => 1,
    });
    payload.extend_from_slice(&module.compile_ms.to_bits().to_le_bytes());
    put_bytes(&mut payload, &module.image);
    put_bytes(&mut payload, module.log.as_bytes());
    payload.extend_from_slice(&(module.resources.len() as u32).to_le_bytes());
    for r in &module.resources {
        put_bytes(&mut payload, r.kernel.as_bytes());
        for figure in [r.registers, r.spill_stores, r.spill_loads, r.shared_bytes, r.stack_bytes] {
            payload.extend_from_slice(&figure.to_le_bytes());
        }
    }

    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&payload));
    out.extend_from_slice(&payload);
    out
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Validates and parses an entry; the error says what was wrong with it.
pub(crate) fn decode_entry(bytes: &[u8], expected_key: &CacheKey) -> std::result::Result<CompiledModule, String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!("truncated header ({} bytes)", bytes.len()));
    }
    let mut header = Reader { bytes, at: 0 };
    if header.take(8)? != MAGIC {
        return Err("bad magic".into());
    }
    let version = header.u32()?;
    if version != FORMAT_VERSION {
        return Err(format!("format version {version}, expected {FORMAT_VERSION}"));
    }
    let payload_len = header.u64()?;
    let checksum = header.take(32)?;
    let payload = &bytes[HEADER_LEN..];
    if payload.len() as u64 != payload_len {
        return Err(format!("payload is {} bytes, header says {payload_len}", payload.len()));
    }
    if Sha256::digest(payload).as_slice() != checksum {
        return Err("checksum mismatch".into());
    }

    let mut r = Reader { bytes: payload, at: 0 };
    if r.take(32)? != expected_key.0 {
        return Err("entry belongs to a different key".into());
    }
    let kind = match r.take(1)?[0] {
        0 => ImageKind::Cubin,
        1 => ImageKind::Ptx,
        other => return Err(format!("unknown image kind {other}")),
    };
    let compile_ms = f64::from_bits(r.u64()?);
    let image = r.bytes()?.to_vec();
    let log = String::from_utf8(r.bytes()?.to_vec()).map_err(|_| "log is not UTF-8")?;
    let count = r.u32()?;
    let mut resources = Vec::new();
    for _ in 0..count {
        let kernel = String::from_utf8(r.bytes()?.to_vec()).map_err(|_| "kernel name is not UTF-8")?;
        resources.push(KernelResources {
            kernel,
            registers: r.u32()?,
            spill_stores: r.u32()?,
            spill_loads: r.u32()?,
            shared_bytes: r.u32()?,
            stack_bytes: r.u32()?,
        });
    }
    if r.at != payload.len() {
        return Err("trailing bytes after payload".into());
    }
    Ok(CompiledModule { image, kind, log, resources, compile_ms })
}

/// Bounds-checked little-endian reader over an entry.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| format!("field of {n} bytes runs past the end at offset {}", self.at))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn bytes(&mut self) -> std::result::Result<&'a [u8], String> {
        let len = usize::try_from(self.u64()?).map_err(|_| "length overflows usize")?;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_module() -> CompiledModule {
        CompiledModule {
            image: (0..=255u8).cycle().take(10_000).collect(),
            kind: ImageKind::Cubin,
            log: "ptxas info    : Used 8 registers".into(),
            resources: vec![KernelResources {
                kernel: "add".into(),
                registers: 8,
                spill_stores: 1,
                spill_loads: 2,
                shared_bytes: 3,
                stack_bytes: 4,
            }],
            compile_ms: 12.5,
        }
    }

    #[test]
    fn entry_round_trips() {
        let key = CacheKey([7; 32]);
        let module = sample_module();
        let decoded = decode_entry(&encode_entry(&key, &module), &key).unwrap();
        assert_eq!(decoded, module);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_rejected() {
        let key = CacheKey([7; 32]);
        let module = CompiledModule { image: vec![1, 2, 3, 4, 5], ..sample_module() };
        let bytes = encode_entry(&key, &module);
        for len in 0..bytes.len() {
            assert!(decode_entry(&bytes[..len], &key).is_err(), "length {len}");
        }
        for at in 0..bytes.len() {
            let mut corrupt = bytes.clone();
            corrupt[at] ^= 0x40;
            assert!(decode_entry(&corrupt, &key).is_err(), "flipped byte {at}");
        }
        assert!(decode_entry(&bytes, &CacheKey([8; 32])).is_err());
    }

    #[test]
    fn concurrent_writers_and_readers_never_see_a_partial_entry() {
        let dir = tempfile::tempdir().unwrap();
        let key = CacheKey([3; 32]);
        let path = dir.path().join(format!("{key}.bin"));
        let module = CompiledModule { image: vec![0xAB; 4 << 20], ..sample_module() };
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10 {
                        write_entry(&path, &key, &module).unwrap();
                    }
                });
            }
            scope.spawn(|| {
                for _ in 0..200 {
                    match fs::read(&path) {
                        Ok(bytes) => assert_eq!(decode_entry(&bytes, &key).unwrap(), module),
                        Err(err) => assert_eq!(err.kind(), io::ErrorKind::NotFound),
                    }
                }
            });
        });
        assert_eq!(decode_entry(&fs::read(&path).unwrap(), &key).unwrap(), module);
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    }
}
