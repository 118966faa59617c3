//! The progress bar of a max-autotune call's tuning: on stderr, once tuning has taken a second
//! (a plan of a few kernels tunes faster than a bar is worth drawing), and only where stderr is a
//! terminal (indicatif draws nothing elsewhere), cleared when tuning ends.

use braze_cuda::TuningProgress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::{Duration, Instant};

/// How long tuning runs before the bar appears.
const SHOW_AFTER: Duration = Duration::from_secs(1);

pub(crate) struct TuningBar {
    bar: ProgressBar,
    started: Instant,
    shown: bool,
}

impl TuningBar {
    pub(crate) fn new() -> Self {
        TuningBar { bar: ProgressBar::hidden(), started: Instant::now(), shown: false }
    }

    /// Moves the bar to `progress`, drawing it from the first update past [`SHOW_AFTER`].
    pub(crate) fn update(&mut self, progress: TuningProgress<'_>) {
        self.update_at(progress, self.started.elapsed(), ProgressDrawTarget::stderr);
    }

    fn update_at(
        &mut self,
        progress: TuningProgress<'_>,
        elapsed: Duration,
        target: impl FnOnce() -> ProgressDrawTarget,
    ) {
        self.bar.set_length(progress.total as u64);
        self.bar.set_position(progress.done as u64);
        self.bar.set_message(progress.kernel.to_string());
        if !self.shown && elapsed >= SHOW_AFTER {
            self.shown = true;
            let style = ProgressStyle::with_template("max-autotune [{bar:30}] {pos}/{len} kernels {elapsed} {msg}")
                .expect("a valid template")
                .progress_chars("=> ");
            self.bar.set_style(style);
            self.bar.set_draw_target(target());
        }
    }
}

impl Drop for TuningBar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(done: usize, kernel: &str) -> TuningProgress<'_> {
        TuningProgress { done, total: 4, kernel }
    }

    #[test]
    fn the_bar_appears_after_a_second_and_follows_the_kernels() {
        let mut bar = TuningBar::new();
        let mut targets = 0;
        bar.update_at(at(0, "row_0"), Duration::from_millis(400), || {
            targets += 1;
            ProgressDrawTarget::hidden()
        });
        assert!(!bar.shown, "drawn before a second of tuning");
        bar.update_at(at(2, "matmul_1"), Duration::from_millis(1200), || {
            targets += 1;
            ProgressDrawTarget::hidden()
        });
        bar.update_at(at(3, "column_2"), Duration::from_millis(1500), || {
            targets += 1;
            ProgressDrawTarget::hidden()
        });
        assert!(bar.shown);
        assert_eq!(targets, 1, "the draw target is set once");
        assert_eq!((bar.bar.position(), bar.bar.length()), (3, Some(4)));
        assert_eq!(bar.bar.message(), "column_2");
    }
}
