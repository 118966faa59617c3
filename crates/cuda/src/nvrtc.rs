//! Runtime compilation of generated CUDA C with NVRTC.
//!
//! Kernels are compiled straight to CUBIN for one architecture so that loading them needs no
//! driver JIT, and with `ptxas -v` so the compiler log carries per-kernel register, spill, shared
//! memory and stack figures, which are parsed into [`KernelResources`]. NVRTC needs no GPU, so
//! all of this works (and is tested) on machines without one.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use cudarc::nvrtc::{result as nvrtc_result, sys as nvrtc_sys};

use crate::error::{CudaError, Result};

/// Whether `libnvrtc` can be loaded. cudarc panics on first use of a missing library, so every
/// entry point here checks this first and returns [`CudaError::NvrtcUnavailable`] instead.
pub fn nvrtc_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the candidate library names and drops the
    // handles again; it touches no NVRTC state.
    *AVAILABLE.get_or_init(|| unsafe { nvrtc_sys::is_culib_present() })
}

fn require_nvrtc() -> Result<()> {
    if nvrtc_available() {
        Ok(())
    } else {
        Err(CudaError::NvrtcUnavailable)
    }
}

/// The NVRTC library version as `(major, minor)`. Part of the kernel cache key, because a
/// different compiler may produce different code from the same source.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    require_nvrtc()?;
    let mut major = 0;
    let mut minor = 0;
    // SAFETY: the library is present (checked above) and both pointers refer to live locals.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|err| CudaError::Nvrtc { call: "nvrtcVersion", reason: format!("{:?}", err.0) })?;
    Ok((major, minor))
}

/// What a [`CompiledModule`]'s image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// Machine code for one architecture; loads with no JIT, and comes with resource figures.
    Cubin,
    /// PTX text (without a trailing NUL); portable, but the driver JIT-compiles it on load.
    Ptx,
}

/// How to compile. The default targets Hopper (`sm_90`) CUBIN with the CUDA headers found on
/// this machine, which is what generated kernels need.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Real architecture such as `sm_90`. For PTX output the matching virtual architecture
    /// (`compute_90`) is used.
    pub arch: String,
    /// Whether to produce CUBIN or PTX.
    pub output: ImageKind,
    /// Header directories passed to NVRTC (`cuda_fp16.h`, `cuda_bf16.h`, ...).
    pub include_dirs: Vec<PathBuf>,
    /// Further NVRTC options, passed through unchanged (e.g. `--use_fast_math`, `-lineinfo`).
    pub extra: Vec<String>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            arch: "sm_90".to_string(),
            output: ImageKind::Cubin,
            include_dirs: default_include_dirs(),
            extra: Vec::new(),
        }
    }
}

impl CompileOptions {
    /// The exact NVRTC argument list these options produce; the kernel cache hashes it.
    pub fn nvrtc_args(&self) -> Result<Vec<String>> {
        let number = self
            .arch
            .strip_prefix("sm_")
            .or_else(|| self.arch.strip_prefix("compute_"))
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric()))
            .ok_or_else(|| {
                CudaError::InvalidArgument(format!(
                    "architecture `{}` is not of the form sm_XX or compute_XX",
                    self.arch
                ))
            })?;
        let mut args = Vec::with_capacity(self.include_dirs.len() + self.extra.len() + 2);
        match self.output {
            ImageKind::Cubin => {
                if self.arch.starts_with("compute_") {
                    return Err(CudaError::InvalidArgument(format!(
                        "CUBIN output needs a real architecture (sm_XX), got `{}`",
                        self.arch
                    )));
                }
                args.push(format!("--gpu-architecture=sm_{number}"));
                args.push("--ptxas-options=-v".to_string());
            }
            ImageKind::Ptx => args.push(format!("--gpu-architecture=compute_{number}")),
        }
        for dir in &self.include_dirs {
            args.push(format!("--include-path={}", dir.display()));
        }
        args.extend(self.extra.iter().cloned());
        Ok(args)
    }
}

/// Per-kernel figures reported by `ptxas -v`: what limits occupancy and what signals spills.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct KernelResources {
    /// Kernel (entry function) name as it appears in the module (mangled unless `extern "C"`).
    pub kernel: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes stored to local memory because registers ran out.
    pub spill_stores: u32,
    /// Bytes loaded back from local memory because registers ran out.
    pub spill_loads: u32,
    /// Static shared memory per block, in bytes.
    pub shared_bytes: u32,
    /// Stack frame per thread, in bytes.
    pub stack_bytes: u32,
}

/// A compiled module image with what the compiler said about it.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledModule {
    /// CUBIN bytes or PTX text, per `kind`.
    pub image: Vec<u8>,
    /// What `image` holds.
    pub kind: ImageKind,
    /// The full NVRTC program log (warnings, `ptxas` figures).
    pub log: String,
    /// Per-kernel resource figures parsed from the log; empty for PTX, which skips `ptxas`.
    pub resources: Vec<KernelResources>,
    /// Wall time NVRTC took, in milliseconds.
    pub compile_ms: f64,
}

impl CompiledModule {
    /// The resource figures of one kernel, if `ptxas` reported any.
    pub fn resources_of(&self, kernel: &str) -> Option<&KernelResources> {
        self.resources.iter().find(|r| r.kernel == kernel)
    }
}

/// Owns an `nvrtcProgram` so that it is destroyed on every path out of [`compile`].
struct Program {
    handle: nvrtc_sys::nvrtcProgram,
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `handle` came from `create_program` and is destroyed only here, once.
        let _ = unsafe { nvrtc_result::destroy_program(self.handle) };
    }
}

fn nvrtc_call_error(call: &'static str, err: nvrtc_result::NvrtcError) -> CudaError {
    CudaError::Nvrtc { call, reason: format!("{:?}", err.0) }
}

/// Turns a NUL-terminated C buffer from NVRTC into bytes without the terminator.
fn c_buffer_to_bytes(buffer: Vec<c_char>) -> Vec<u8> {
    let mut bytes: Vec<u8> = buffer.into_iter().map(|c| c as u8).collect();
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}

/// Compiles one CUDA C translation unit. `name` is the file name NVRTC uses in its messages.
///
/// A source that does not compile yields [`CudaError::Compile`] carrying the log and the source.
/// A source whose launch bounds ask for blocks an SM ([`braze_codegen::occupancy_hints`]) is
/// compiled again without the hint when under the register cap they set a kernel spills or keeps
/// a stack frame (a stack is where a capped kernel's slow-path calls put what no longer fits), or
/// when a kernel that reached the cap needs more than an eighth over it left to itself: squeezing
/// it that far costs more than the blocks it gains (gpt2_step's f32 layer norm rows over 768
/// columns, 77 registers left to themselves, ran 7.5% slower capped at 64 on the H100, call F,
/// where mlp_step's GELU backward rows, 66, ran 6% faster). Without the hint the registers are
/// ptxas's to choose; where it then spills too, the source is compiled a third time for one block
/// an SM. The module returned is the one kept, its log noting why.
pub fn compile(source: &str, name: &str, opts: &CompileOptions) -> Result<CompiledModule> {
    let module = compile_once(source, name, opts)?;
    let define = format!("-D{}", braze_codegen::NO_OCCUPANCY_HINT);
    let hints = braze_codegen::occupancy_hints(source);
    if hints.is_empty() || opts.extra.contains(&define) {
        return Ok(module);
    }
    let hinted = HintedResources { hints: &hints, resources: &module.resources };
    if hinted.fits() {
        return Ok(module);
    }
    let mut relaxed = opts.clone();
    relaxed.extra.push(define);
    let again = compile_once(source, name, &relaxed)?;
    let verdict = hinted.verdict(&again.resources);
    let dropped = verdict != HintVerdict::Keep;
    let (mut kept, other, why) = match verdict {
        HintVerdict::Spills => (again, module, "compiled again without the occupancy hint: under its register cap it spilled or kept a stack"),
        HintVerdict::Squeezed => (again, module, "compiled again without the occupancy hint: left to itself it needs over an eighth more registers than the cap"),
        HintVerdict::Fewer => (again, module, "compiled again without the occupancy hint: left to itself it uses fewer registers, and more blocks fit an SM"),
        HintVerdict::Keep => (module, again, "kept the occupancy hint: left to itself it needs at most an eighth more registers than the cap"),
    };
    kept.compile_ms += other.compile_ms;
    kept.log = format!("{why}\n{}", kept.log);
    if dropped && spills(&kept.resources) {
        let mut one_block = opts.clone();
        one_block.extra.push(format!("-D{}", braze_codegen::ONE_BLOCK_AN_SM));
        let mut third = compile_once(source, name, &one_block)?;
        third.compile_ms += kept.compile_ms;
        third.log = format!("{why}; left to ptxas it spilled too, so compiled for one block an SM\n{}", third.log);
        return Ok(third);
    }
    Ok(kept)
}

/// Whether a kernel spilled or kept a stack frame.
fn spills(resources: &[KernelResources]) -> bool {
    resources.iter().any(|r| r.spill_stores > 0 || r.spill_loads > 0 || r.stack_bytes > 0)
}

/// A module compiled under its occupancy hints: each hinted kernel's hint beside what `ptxas`
/// reported.
struct HintedResources<'a> {
    hints: &'a [braze_codegen::OccupancyHint],
    resources: &'a [KernelResources],
}

/// Which compile of a hinted source to keep.
#[derive(Debug, PartialEq, Eq)]
enum HintVerdict {
    /// The one without the hint: under the cap a kernel spilled or kept a stack.
    Spills,
    /// The one without the hint: a kernel left to itself needs over an eighth more than its cap.
    Squeezed,
    /// The one without the hint: a kernel left to itself uses fewer registers than under the
    /// hint, so that more of its blocks fit an SM.
    Fewer,
    /// The hinted one.
    Keep,
}

impl HintedResources<'_> {
    fn hint_of(&self, kernel: &str) -> Option<&braze_codegen::OccupancyHint> {
        self.hints.iter().find(|h| h.kernel == kernel)
    }

    fn registers_of(&self, kernel: &str) -> Option<u32> {
        self.resources.iter().find(|r| r.kernel == kernel).map(|r| r.registers)
    }

    /// Whether the hinted compile stands without a compile to compare: nothing spilled and no
    /// hinted kernel reached its cap.
    fn fits(&self) -> bool {
        !spills(self.resources)
            && !self.resources.iter().any(|r| self.hint_of(&r.kernel).is_some_and(|h| r.registers >= h.cap()))
    }

    /// The verdict given the resources of the same source compiled without the hint.
    fn verdict(&self, unhinted: &[KernelResources]) -> HintVerdict {
        if spills(self.resources) {
            return HintVerdict::Spills;
        }
        let hinted =
            |r: &KernelResources| self.hint_of(&r.kernel).map(|h| (h, self.registers_of(&r.kernel).unwrap_or(0)));
        if unhinted.iter().any(|r| hinted(r).is_some_and(|(h, _)| r.registers > h.cap() + h.cap() / 8)) {
            return HintVerdict::Squeezed;
        }
        let more_blocks = |r: &KernelResources| {
            hinted(r).is_some_and(|(h, capped)| h.resident_blocks(r.registers) > h.resident_blocks(capped))
        };
        if unhinted.iter().any(more_blocks) {
            HintVerdict::Fewer
        } else {
            HintVerdict::Keep
        }
    }
}

/// [`compile`] with the options as given.
fn compile_once(source: &str, name: &str, opts: &CompileOptions) -> Result<CompiledModule> {
    require_nvrtc()?;
    let args = opts.nvrtc_args()?;
    let source_c =
        CString::new(source).map_err(|_| CudaError::InvalidArgument("kernel source contains a NUL byte".into()))?;
    let name_c =
        CString::new(name).map_err(|_| CudaError::InvalidArgument(format!("program name {name:?} contains NUL")))?;
    if args.iter().any(|a| a.contains('\0')) {
        return Err(CudaError::InvalidArgument("a compile option contains a NUL byte".into()));
    }

    // `source_c` and `name_c` outlive `program` (declared before it, dropped after it), as
    // NVRTC may keep pointers to them until the program is destroyed.
    let program = Program {
        handle: nvrtc_result::create_program(&source_c, Some(&name_c))
            .map_err(|e| nvrtc_call_error("nvrtcCreateProgram", e))?,
    };

    let started = Instant::now();
    // SAFETY: `program.handle` is a live program (destroyed only by `Program::drop`), and the
    // options were checked above to contain no NUL bytes, so cudarc's CString conversion cannot
    // fail.
    let compiled = unsafe { nvrtc_result::compile_program(program.handle, &args) };
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;

    // SAFETY: as above, `program.handle` is live.
    let log = unsafe { nvrtc_result::get_program_log(program.handle) }
        .map(|buffer| String::from_utf8_lossy(&c_buffer_to_bytes(buffer)).into_owned())
        .map_err(|e| nvrtc_call_error("nvrtcGetProgramLog", e))?;

    if let Err(err) = compiled {
        let log = if err.0 == nvrtc_sys::nvrtcResult::NVRTC_ERROR_COMPILATION {
            log
        } else {
            format!("nvrtcCompileProgram returned {:?}\n{log}", err.0)
        };
        return Err(CudaError::Compile { name: name.to_string(), log, source_code: source.to_string() });
    }

    let image = match opts.output {
        ImageKind::Cubin => cubin_of(&program)?,
        // SAFETY: `program.handle` is live and compiled successfully.
        ImageKind::Ptx => c_buffer_to_bytes(
            unsafe { nvrtc_result::get_ptx(program.handle) }.map_err(|e| nvrtc_call_error("nvrtcGetPTX", e))?,
        ),
    };
    let resources = match opts.output {
        ImageKind::Cubin => parse_ptxas_resources(&log),
        ImageKind::Ptx => Vec::new(),
    };
    Ok(CompiledModule { image, kind: opts.output, log, resources, compile_ms })
}

fn cubin_of(program: &Program) -> Result<Vec<u8>> {
    let mut size = 0usize;
    // SAFETY: `program.handle` is live and compiled for a real architecture; `size` is a live
    // local the call writes to.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(program.handle, &mut size) }
        .result()
        .map_err(|e| nvrtc_call_error("nvrtcGetCUBINSize", e))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the `size` bytes NVRTC reported for this program's CUBIN.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(program.handle, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| nvrtc_call_error("nvrtcGetCUBIN", e))?;
    if cubin.is_empty() {
        return Err(CudaError::Nvrtc {
            call: "nvrtcGetCUBIN",
            reason: "empty CUBIN (was a virtual architecture requested?)".into(),
        });
    }
    Ok(cubin)
}

/// Parses the `ptxas info` lines of an NVRTC log into per-entry-function figures.
///
/// Only entry functions (kernels) are reported; non-inlined device functions also get
/// "Function properties" lines, which are skipped.
pub fn parse_ptxas_resources(log: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    // Index into `kernels` of the entry whose lines are being read.
    let mut current: Option<usize> = None;
    // Whether the last "Function properties for X" line named the current entry.
    let mut properties_for_current = false;

    for line in log.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("ptxas info") {
            let rest = rest.trim_start().trim_start_matches(':').trim();
            if let Some(name) = rest.strip_prefix("Compiling entry function").and_then(quoted_name) {
                kernels.push(KernelResources { kernel: name.to_string(), ..Default::default() });
                current = Some(kernels.len() - 1);
                properties_for_current = false;
            } else if let Some(name) = rest.strip_prefix("Function properties for") {
                let name = name.trim();
                properties_for_current = current.is_some_and(|i| kernels[i].kernel == name);
            } else if let Some(figures) = rest.strip_prefix("Used") {
                if let Some(i) = current {
                    let entry = &mut kernels[i];
                    for part in figures.split(',') {
                        let part = part.trim();
                        if let Some(n) = number_before(part, "registers") {
                            entry.registers = n;
                        } else if let Some(n) = number_before(part, "bytes smem") {
                            entry.shared_bytes = n;
                        }
                    }
                }
            }
        } else if properties_for_current && line.contains("bytes stack frame") {
            if let Some(i) = current {
                let entry = &mut kernels[i];
                for part in line.split(',') {
                    let part = part.trim();
                    if let Some(n) = number_before(part, "bytes stack frame") {
                        entry.stack_bytes = n;
                    } else if let Some(n) = number_before(part, "bytes spill stores") {
                        entry.spill_stores = n;
                    } else if let Some(n) = number_before(part, "bytes spill loads") {
                        entry.spill_loads = n;
                    }
                }
            }
            properties_for_current = false;
        }
    }
    kernels
}

/// `'name' for 'sm_90'` -> `name`.
fn quoted_name(text: &str) -> Option<&str> {
    let text = text.trim();
    let text = text.strip_prefix('\'')?;
    let end = text.find('\'')?;
    Some(&text[..end])
}

/// `"12 registers"` with suffix `"registers"` -> 12; only the last word before the suffix is
/// read, so line prefixes such as `ptxas         .` are ignored.
fn number_before(part: &str, suffix: &str) -> Option<u32> {
    part.strip_suffix(suffix)?.split_whitespace().next_back()?.parse().ok()
}

/// Where the CUDA headers are: `BRAZE_CUDA_INCLUDE` (a path list), else the toolkit at
/// `/usr/local/cuda/include`, else a pip-installed `nvidia/cu13/include` (next to the loaded or
/// `LD_LIBRARY_PATH`-listed libnvrtc, in `BRAZE_NVRTC_DIR` or `~/.cache/braze-nvrtc`, or in a
/// Python site directory). Empty when none is found; kernels without includes still compile.
/// Found once per process: headers do not move while it runs.
pub fn default_include_dirs() -> Vec<PathBuf> {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(find_include_dirs).clone()
}

fn find_include_dirs() -> Vec<PathBuf> {
    if let Some(list) = std::env::var_os("BRAZE_CUDA_INCLUDE") {
        let dirs: Vec<PathBuf> = std::env::split_paths(&list).filter(|d| !d.as_os_str().is_empty()).collect();
        if !dirs.is_empty() {
            return dirs;
        }
    }
    let toolkit = PathBuf::from("/usr/local/cuda/include");
    if has_cuda_headers(&toolkit) {
        let mut dirs = vec![toolkit.clone()];
        let cccl = toolkit.join("cccl");
        if cccl.is_dir() {
            dirs.push(cccl);
        }
        return dirs;
    }
    pip_include_candidates().into_iter().find(|dir| has_cuda_headers(dir)).map(|dir| vec![dir]).unwrap_or_default()
}

fn has_cuda_headers(dir: &Path) -> bool {
    dir.join("cuda_fp16.h").is_file()
}

/// Include directories that a pip install of the NVRTC wheels would have, most specific first.
fn pip_include_candidates() -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    // The libnvrtc this process loads: its wheel's headers match it exactly. Querying the
    // version loads it (and keeps it loaded) so that it shows in the memory map.
    if nvrtc_available() {
        let _ = nvrtc_version();
    }
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        for line in maps.lines() {
            if let Some(start) = line.find('/') {
                let path = Path::new(&line[start..]);
                let is_nvrtc = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc.so"));
                if let (true, Some(lib_dir)) = (is_nvrtc, path.parent()) {
                    candidates.push(lib_dir.join("../include"));
                }
            }
        }
    }
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        for lib_dir in std::env::split_paths(&paths) {
            let has_nvrtc = std::fs::read_dir(&lib_dir).is_ok_and(|entries| {
                entries.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("libnvrtc.so")))
            });
            if has_nvrtc {
                candidates.push(lib_dir.join("../include"));
            }
        }
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let install_dir = std::env::var_os("BRAZE_NVRTC_DIR")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".cache/braze-nvrtc")));
    if let Some(dir) = install_dir {
        candidates.push(dir.join("nvidia/cu13/include"));
    }
    let mut site_roots = vec![PathBuf::from("/usr/local/lib"), PathBuf::from("/usr/lib")];
    if let Some(home) = &home {
        site_roots.insert(0, home.join(".local/lib"));
    }
    for root in site_roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3")))
            .collect();
        pythons.sort();
        for python in pythons.iter().rev() {
            for site in ["site-packages", "dist-packages"] {
                candidates.push(python.join(site).join("nvidia/cu13/include"));
            }
        }
    }
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(kernel: &str, registers: u32) -> KernelResources {
        KernelResources { kernel: kernel.into(), registers, ..Default::default() }
    }

    #[test]
    fn the_hint_stays_unless_it_spills_or_squeezes_a_kernel_by_over_an_eighth() {
        let caps = [braze_codegen::OccupancyHint { kernel: "rows".into(), block: 256, blocks: 4 }];
        // Under the cap: no second compile.
        let below = [used("rows", 56)];
        assert!(HintedResources { hints: &caps, resources: &below }.fits());
        // At the cap: left to itself 72 registers (an eighth over) keeps the hint, 73 drops it.
        let at_cap = [used("rows", 64)];
        let hinted = HintedResources { hints: &caps, resources: &at_cap };
        assert!(!hinted.fits());
        assert_eq!(hinted.verdict(&[used("rows", 66)]), HintVerdict::Keep);
        assert_eq!(hinted.verdict(&[used("rows", 72)]), HintVerdict::Keep);
        assert_eq!(hinted.verdict(&[used("rows", 77)]), HintVerdict::Squeezed);
        // A kernel without a hint never counts; a spill anywhere drops the hint.
        assert_eq!(hinted.verdict(&[used("rows", 70), used("other", 200)]), HintVerdict::Keep);
        // Left to itself with fewer registers than the hint's compile and more blocks an SM (a
        // 64-thread block under a 16-block hint: 44 registers (48 allocated) hold 21 blocks, 64 hold 16).
        let small = [braze_codegen::OccupancyHint { kernel: "rows".into(), block: 64, blocks: 16 }];
        let hinted_small = HintedResources { hints: &small, resources: &at_cap };
        assert_eq!(hinted_small.verdict(&[used("rows", 44)]), HintVerdict::Fewer);
        assert_eq!(hinted.verdict(&[used("rows", 62)]), HintVerdict::Keep);
        let spilled = [KernelResources { spill_stores: 8, ..used("rows", 64) }];
        let hinted = HintedResources { hints: &caps, resources: &spilled };
        assert!(!hinted.fits());
        assert_eq!(hinted.verdict(&[used("rows", 66)]), HintVerdict::Spills);
    }

    const LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'calls_device_fn' for 'sm_90'
ptxas info    : Function properties for device_fn
ptxas         .     8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for calls_device_fn
ptxas         .     16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 24 bytes cumulative stack size, 2048 bytes smem
ptxas info    : Compile time = 17.625 ms
ptxas info    : Compiling entry function 'add' for 'sm_90'
ptxas info    : Function properties for add
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 380 bytes cmem[0]
ptxas info    : Function properties for _Z9device_fnPfi
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
";

    #[test]
    fn parses_entries_and_skips_device_functions() {
        let parsed = parse_ptxas_resources(LOG);
        assert_eq!(
            parsed,
            vec![
                KernelResources {
                    kernel: "calls_device_fn".into(),
                    registers: 40,
                    spill_stores: 4,
                    spill_loads: 8,
                    shared_bytes: 2048,
                    stack_bytes: 16,
                },
                KernelResources { kernel: "add".into(), registers: 8, ..Default::default() },
            ]
        );
    }

    #[test]
    fn options_render_arch_for_each_output() {
        let mut opts = CompileOptions {
            include_dirs: vec![PathBuf::from("/inc")],
            extra: vec!["--use_fast_math".into()],
            ..CompileOptions::default()
        };
        assert_eq!(
            opts.nvrtc_args().unwrap(),
            vec!["--gpu-architecture=sm_90", "--ptxas-options=-v", "--include-path=/inc", "--use_fast_math"]
        );
        opts.output = ImageKind::Ptx;
        assert_eq!(opts.nvrtc_args().unwrap()[0], "--gpu-architecture=compute_90");
        opts.arch = "volta".into();
        assert!(matches!(opts.nvrtc_args(), Err(CudaError::InvalidArgument(_))));
    }
}
