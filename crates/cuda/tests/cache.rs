//! The kernel cache, in memory and on disk; runs wherever libnvrtc loads, no GPU needed.

mod common;

use std::fs;
use std::sync::{Arc, Barrier};

use braze_cuda::{CacheStats, CompileOptions, CudaError, KernelCache};

fn kernel_source(tag: &str) -> String {
    format!(
        "extern \"C\" __global__ void scale_{tag}(float* x, float s, int n) {{\n\
         \x20   int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
         \x20   if (i < n) x[i] *= s;\n\
         }}\n"
    )
}

fn stats(memory_hits: u64, disk_hits: u64, compiles: u64, corrupt_entries: u64) -> CacheStats {
    CacheStats { memory_hits, disk_hits, compiles, corrupt_entries, write_failures: 0 }
}

#[test]
fn second_lookup_is_a_memory_hit() {
    if !common::nvrtc_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::with_dir(dir.path()).unwrap();
    let opts = CompileOptions::default();
    let source = kernel_source("memory");
    let first = cache.get_or_compile(&source, "k.cu", &opts).unwrap();
    let second = cache.get_or_compile(&source, "k.cu", &opts).unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(cache.stats(), stats(1, 0, 1, 0));
}

#[test]
fn fresh_cache_on_same_dir_hits_disk_without_compiling() {
    if !common::nvrtc_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let opts = CompileOptions::default();
    let source = kernel_source("disk");
    let compiled = KernelCache::with_dir(dir.path()).unwrap().get_or_compile(&source, "k.cu", &opts).unwrap();

    let later = KernelCache::with_dir(dir.path()).unwrap();
    let loaded = later.get_or_compile(&source, "k.cu", &opts).unwrap();
    assert_eq!(*loaded, *compiled);
    assert_eq!(later.stats(), stats(0, 1, 0, 0));
    assert!(loaded.resources_of("scale_disk").unwrap().registers > 0);
}

#[test]
fn different_inputs_get_different_entries() {
    if !common::nvrtc_ready() {
        return;
    }
    let opts = CompileOptions::default();
    let fast_math = CompileOptions { extra: vec!["--use_fast_math".into()], ..CompileOptions::default() };
    let source = kernel_source("keys");
    let base = KernelCache::key(&source, "k.cu", &opts).unwrap();
    assert_eq!(base, KernelCache::key(&source, "k.cu", &opts).unwrap());
    assert_ne!(base, KernelCache::key(&source, "k.cu", &fast_math).unwrap());
    assert_ne!(base, KernelCache::key(&source, "other.cu", &opts).unwrap());
    assert_ne!(base, KernelCache::key(&kernel_source("keys2"), "k.cu", &opts).unwrap());
}

/// Damages the entry in a way `damage` chooses, then checks it is detected, recompiled,
/// rewritten, and afterwards served from disk again.
fn check_recovery(tag: &str, damage: impl FnOnce(&mut Vec<u8>)) {
    let dir = tempfile::tempdir().unwrap();
    let opts = CompileOptions::default();
    let source = kernel_source(tag);
    let original = KernelCache::with_dir(dir.path()).unwrap().get_or_compile(&source, "k.cu", &opts).unwrap();
    let probe = KernelCache::with_dir(dir.path()).unwrap();
    let key = KernelCache::key(&source, "k.cu", &opts).unwrap();
    let path = probe.entry_path(&key).unwrap();
    let mut bytes = fs::read(&path).unwrap();
    damage(&mut bytes);
    fs::write(&path, &bytes).unwrap();

    let recovering = KernelCache::with_dir(dir.path()).unwrap();
    let recompiled = recovering.get_or_compile(&source, "k.cu", &opts).unwrap();
    assert_eq!(recovering.stats(), stats(0, 0, 1, 1));
    assert_eq!(recompiled.image, original.image);
    assert_ne!(fs::read(&path).unwrap(), bytes, "the damaged entry was rewritten");

    let after = KernelCache::with_dir(dir.path()).unwrap();
    after.get_or_compile(&source, "k.cu", &opts).unwrap();
    assert_eq!(after.stats(), stats(0, 1, 0, 0));
}

#[test]
fn truncated_entry_is_recompiled_and_rewritten() {
    if !common::nvrtc_ready() {
        return;
    }
    check_recovery("truncated", |bytes| bytes.truncate(bytes.len() / 2));
    check_recovery("header_only", |bytes| bytes.truncate(20));
    check_recovery("empty", |bytes| bytes.clear());
}

#[test]
fn corrupted_byte_is_recompiled_and_rewritten() {
    if !common::nvrtc_ready() {
        return;
    }
    check_recovery("flipped", |bytes| {
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
    });
    check_recovery("bad_magic", |bytes| bytes[0] = b'X');
}

#[test]
fn concurrent_writers_of_one_key_leave_a_valid_entry() {
    if !common::nvrtc_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let opts = CompileOptions::default();
    let source = kernel_source("race");
    let start = Barrier::new(2);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                // Separate caches behave like separate processes sharing the directory.
                let cache = KernelCache::with_dir(dir.path()).unwrap();
                start.wait();
                cache.get_or_compile(&source, "k.cu", &opts).unwrap();
            });
        }
    });
    let reader = KernelCache::with_dir(dir.path()).unwrap();
    let module = reader.get_or_compile(&source, "k.cu", &opts).unwrap();
    assert_eq!(reader.stats(), stats(0, 1, 0, 0));
    assert!(module.resources_of("scale_race").is_some());
    let leftovers: Vec<_> = fs::read_dir(reader.entry_dir().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn compile_errors_are_returned_and_not_cached() {
    if !common::nvrtc_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::with_dir(dir.path()).unwrap();
    let opts = CompileOptions::default();
    for _ in 0..2 {
        let err = cache.get_or_compile("__global__ void f( {", "bad.cu", &opts).unwrap_err();
        assert!(matches!(err, CudaError::Compile { .. }));
    }
    assert_eq!(cache.stats(), stats(0, 0, 0, 0));
    assert_eq!(fs::read_dir(cache.entry_dir().unwrap()).unwrap().count(), 0);
}

#[test]
fn in_memory_cache_writes_nothing() {
    if !common::nvrtc_ready() {
        return;
    }
    let cache = KernelCache::in_memory();
    assert!(cache.entry_dir().is_none());
    let opts = CompileOptions::default();
    let source = kernel_source("in_memory");
    cache.get_or_compile(&source, "k.cu", &opts).unwrap();
    cache.get_or_compile(&source, "k.cu", &opts).unwrap();
    assert_eq!(cache.stats(), stats(1, 0, 1, 0));
}

#[test]
fn a_damaged_entry_is_warned_about_once_per_process() {
    if !common::nvrtc_ready() {
        return;
    }
    use std::io::Write;
    use std::sync::Mutex;

    /// Collects formatted log output in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();

    let dir = tempfile::tempdir().unwrap();
    let opts = CompileOptions::default();
    let source = kernel_source("warned");
    let key = KernelCache::key(&source, "k.cu", &opts).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..2 {
            let cache = KernelCache::with_dir(dir.path()).unwrap();
            cache.get_or_compile(&source, "k.cu", &opts).unwrap();
            fs::write(cache.entry_path(&key).unwrap(), b"garbage").unwrap();
            let recovering = KernelCache::with_dir(dir.path()).unwrap();
            recovering.get_or_compile(&source, "k.cu", &opts).unwrap();
            assert_eq!(recovering.stats().corrupt_entries, 1);
        }
    });
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert_eq!(log.matches("invalid kernel cache entry").count(), 1, "{log}");
    assert!(log.contains("braze::cache"), "{log}");
    assert!(log.contains("WARN"), "{log}");
}
