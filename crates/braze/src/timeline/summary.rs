//! What a timeline says about keeping the GPU busy: the share of the steps' time the compute
//! stream was running something, and the largest gaps with what the host was doing meanwhile.

use super::{Span, Trace, Track};
use std::fmt;

/// Gaps listed in a summary.
const GAPS_SHOWN: usize = 5;
/// Host spans named per gap.
const HOST_SPANS_PER_GAP: usize = 3;

/// GPU busy % over the steps and the largest idle gaps.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Steps (host spans of category `step`); 0 when the program marked none.
    pub steps: usize,
    /// The time judged: from the first step's start to the last one's end, or the device spans'
    /// extent without steps.
    pub window_us: f64,
    /// Time within the window the compute stream ran work (overlapping spans counted once).
    pub busy_us: f64,
    /// Time the copy stream ran copies within the window.
    pub copy_us: f64,
    /// Largest idle gaps of the compute stream within the window, longest first.
    pub gaps: Vec<Gap>,
}

/// An idle stretch of the compute stream and what the host was doing during it.
#[derive(Clone, Debug, PartialEq)]
pub struct Gap {
    pub start_us: f64,
    pub dur_us: f64,
    /// The most specific host spans overlapping the gap (shortest first), as `name (detail)`.
    pub host: Vec<String>,
}

impl Summary {
    /// GPU busy share of the window, in percent (0 for an empty window).
    pub fn busy_percent(&self) -> f64 {
        if self.window_us <= 0.0 {
            0.0
        } else {
            100.0 * self.busy_us / self.window_us
        }
    }

    pub fn of(trace: &Trace) -> Summary {
        let steps: Vec<&Span> =
            trace.spans.iter().filter(|s| matches!(s.track, Track::Host(_)) && s.category == "step").collect();
        let device = |track: Track| -> Vec<(f64, f64)> {
            merge(trace.spans.iter().filter(|s| s.track == track).map(|s| (s.start_us, s.end_us())).collect())
        };
        let busy = device(Track::Compute);
        let window = if steps.is_empty() {
            busy.first().map(|first| (first.0, busy.last().map_or(first.1, |last| last.1)))
        } else {
            let start = steps.iter().map(|s| s.start_us).fold(f64::INFINITY, f64::min);
            let end = steps.iter().map(|s| s.end_us()).fold(f64::NEG_INFINITY, f64::max);
            Some((start, end))
        };
        let Some((from, to)) = window else {
            return Summary { steps: steps.len(), window_us: 0.0, busy_us: 0.0, copy_us: 0.0, gaps: Vec::new() };
        };
        let clip = |intervals: &[(f64, f64)]| -> Vec<(f64, f64)> {
            intervals.iter().map(|&(a, b)| (a.max(from), b.min(to))).filter(|(a, b)| b > a).collect()
        };
        let busy = clip(&busy);
        let copies = clip(&device(Track::Copy));
        let mut idle = Vec::new();
        let mut cursor = from;
        for &(a, b) in &busy {
            if a > cursor {
                idle.push((cursor, a));
            }
            cursor = cursor.max(b);
        }
        if to > cursor {
            idle.push((cursor, to));
        }
        idle.sort_by(|x, y| (y.1 - y.0).total_cmp(&(x.1 - x.0)));
        let gaps = idle
            .into_iter()
            .take(GAPS_SHOWN)
            .map(|(a, b)| Gap { start_us: a, dur_us: b - a, host: host_during(trace, a, b) })
            .collect();
        Summary {
            steps: steps.len(),
            window_us: to - from,
            busy_us: busy.iter().map(|(a, b)| b - a).sum(),
            copy_us: copies.iter().map(|(a, b)| b - a).sum(),
            gaps,
        }
    }
}

/// Sorted, overlapping intervals joined.
fn merge(mut intervals: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    intervals.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(intervals.len());
    for (a, b) in intervals {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// The host spans overlapping `a..b` other than whole steps, the most specific (shortest) first.
fn host_during(trace: &Trace, a: f64, b: f64) -> Vec<String> {
    let mut overlapping: Vec<&Span> = trace
        .spans
        .iter()
        .filter(|s| matches!(s.track, Track::Host(_)) && s.category != "step" && s.start_us < b && s.end_us() > a)
        .collect();
    overlapping.sort_by(|x, y| x.dur_us.total_cmp(&y.dur_us));
    overlapping
        .into_iter()
        .take(HOST_SPANS_PER_GAP)
        .map(|s| match &s.detail {
            Some(detail) => format!("{} ({detail})", s.name),
            None => s.name.clone(),
        })
        .collect()
}

fn ms(us: f64) -> String {
    format!("{:.3} ms", us / 1e3)
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let over = if self.steps > 0 { format!("{} steps", self.steps) } else { "the device spans".into() };
        writeln!(
            f,
            "GPU busy: {:.1}% of {} over {over} (compute {}, copies {})",
            self.busy_percent(),
            ms(self.window_us),
            ms(self.busy_us),
            ms(self.copy_us)
        )?;
        if self.gaps.is_empty() {
            return writeln!(f, "no gaps");
        }
        writeln!(f, "largest gaps:")?;
        for gap in &self.gaps {
            let host = if gap.host.is_empty() { "nothing braze traced".to_string() } else { gap.host.join("; ") };
            writeln!(f, "  {} at +{}: host in {host}", ms(gap.dur_us), ms(gap.start_us))?;
        }
        Ok(())
    }
}
