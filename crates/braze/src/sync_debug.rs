//! Host synchronizations in eager code: the sync debug mode (as PyTorch's
//! `torch.cuda.set_sync_debug_mode`) and the per-thread count of syncs.
//!
//! Every eager read of a tensor value on the host (`item`, `to_vec`, `to_bool`, `to_host`,
//! `to_device(Device::Cpu)`, `nonzero`, a host custom op's inputs) and every host read at a graph
//! break of a lenient compiled call goes through [`sync_point`]. It counts the sync on this
//! thread, and by the mode logs a warning or returns [`Error::HostSync`] naming the op and the
//! caller's `file:line:col`.
//!
//! A read counts whatever the tensor's device, also on the CPU reference backend where nothing
//! waits: the same code on a GPU waits there, so code developed on the CPU shows the syncs it will
//! have on a GPU (as graph breaks do). A fullgraph compiled call has no syncs: a host read there
//! is a graph break error before anything runs.
//!
//! The mode is process-wide, as PyTorch's is, because the syncs it looks for may be on any
//! thread. The count is per thread, so a training loop reads its own syncs per step.

use crate::logging::{self, targets};
use crate::timeline::{self, SpanGuard};
use crate::{BreakKind, Error, Result};
use braze_ir::SourceLoc;
use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// What happens at a host synchronization in eager code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SyncDebugMode {
    /// Nothing beyond the count ([`sync_count`]).
    #[default]
    Off,
    /// A warning on the `braze::syncs` target naming the op and the caller's `file:line:col`.
    Warn,
    /// An [`Error::HostSync`] naming the op and the caller's `file:line:col`; the value is not read.
    Error,
}

impl SyncDebugMode {
    pub fn name(self) -> &'static str {
        match self {
            SyncDebugMode::Off => "off",
            SyncDebugMode::Warn => "warn",
            SyncDebugMode::Error => "error",
        }
    }

    /// The mode a `BRAZE_SYNC_DEBUG` value names (`off`, `warn` or `error`, any case).
    pub fn parse(value: &str) -> Option<SyncDebugMode> {
        [SyncDebugMode::Off, SyncDebugMode::Warn, SyncDebugMode::Error]
            .into_iter()
            .find(|mode| value.trim().eq_ignore_ascii_case(mode.name()))
    }

    fn to_code(self) -> u8 {
        match self {
            SyncDebugMode::Off => 0,
            SyncDebugMode::Warn => 1,
            SyncDebugMode::Error => 2,
        }
    }

    fn from_code(code: u8) -> SyncDebugMode {
        match code {
            1 => SyncDebugMode::Warn,
            2 => SyncDebugMode::Error,
            _ => SyncDebugMode::Off,
        }
    }
}

impl fmt::Display for SyncDebugMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Not yet read from `BRAZE_SYNC_DEBUG` nor set.
const UNSET: u8 = u8::MAX;
static MODE: AtomicU8 = AtomicU8::new(UNSET);

thread_local! {
    static SYNCS: Cell<u64> = const { Cell::new(0) };
}

/// Sets the sync debug mode for the whole process. It replaces the starting mode that
/// `BRAZE_SYNC_DEBUG` gave.
pub fn set_sync_debug_mode(mode: SyncDebugMode) {
    MODE.store(mode.to_code(), Ordering::Release);
    if mode == SyncDebugMode::Warn {
        logging::init();
    }
}

/// The sync debug mode: the last [`set_sync_debug_mode`], else `BRAZE_SYNC_DEBUG`, else off.
pub fn sync_debug_mode() -> SyncDebugMode {
    let code = MODE.load(Ordering::Acquire);
    if code != UNSET {
        return SyncDebugMode::from_code(code);
    }
    let from_env = env_mode();
    // A set_sync_debug_mode racing with this first read wins.
    match MODE.compare_exchange(UNSET, from_env.to_code(), Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => from_env,
        Err(set) => SyncDebugMode::from_code(set),
    }
}

fn env_mode() -> SyncDebugMode {
    let Ok(value) = std::env::var("BRAZE_SYNC_DEBUG") else { return SyncDebugMode::Off };
    match SyncDebugMode::parse(&value) {
        Some(mode) => mode,
        None if value.trim().is_empty() => SyncDebugMode::Off,
        None => {
            logging::init();
            tracing::warn!(
                target: "braze",
                "BRAZE_SYNC_DEBUG: unknown mode `{value}`; known: off, warn, error (using off)"
            );
            SyncDebugMode::Off
        }
    }
}

/// Host synchronizations on this thread so far (counted in every mode, also off; a sync refused
/// in error mode did not happen and is not counted). Read it before and after a training step
/// for the step's syncs.
pub fn sync_count() -> u64 {
    SYNCS.with(Cell::get)
}

/// One host synchronization: `op` (of `kind`, for the hint) called at `loc` waits for a tensor
/// value. By the mode it warns or errors; `Ok` means the read goes on, and it is counted. The
/// guard is the sync's span on a timeline: keep it until the value has been read.
pub(crate) fn sync_point(kind: BreakKind, op: &str, loc: &SourceLoc) -> Result<SpanGuard> {
    match sync_debug_mode() {
        SyncDebugMode::Off => {}
        SyncDebugMode::Warn => {
            logging::init();
            tracing::warn!(
                target: targets::SYNCS,
                op,
                location = %loc,
                "host synchronization: `{op}` at {loc} {}; hint: {}",
                kind.description(),
                kind.hint()
            );
        }
        SyncDebugMode::Error => {
            return Err(Error::HostSync { kind, op: op.to_string(), loc: loc.clone(), hint: kind.hint() })
        }
    }
    SYNCS.with(|count| count.set(count.get() + 1));
    Ok(timeline::host_span("sync", || format!("sync `{op}`"), Some(loc.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_braze_sync_debug_spells_them() {
        assert_eq!(SyncDebugMode::parse("warn"), Some(SyncDebugMode::Warn));
        assert_eq!(SyncDebugMode::parse(" ERROR "), Some(SyncDebugMode::Error));
        assert_eq!(SyncDebugMode::parse("off"), Some(SyncDebugMode::Off));
        assert_eq!(SyncDebugMode::parse("warning"), None);
        for mode in [SyncDebugMode::Off, SyncDebugMode::Warn, SyncDebugMode::Error] {
            assert_eq!(SyncDebugMode::from_code(mode.to_code()), mode);
            assert_eq!(SyncDebugMode::parse(&mode.to_string()), Some(mode));
        }
    }
}
