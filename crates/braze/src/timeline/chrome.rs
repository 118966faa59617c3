//! The Chrome trace event format (what `chrome://tracing` and Perfetto open): a trace is a JSON
//! object whose `traceEvents` are complete events (`"ph": "X"`, microsecond `ts` and `dur`) on
//! tracks named by `pid`/`tid`, with metadata events naming the processes and threads.
//!
//! braze writes the host as process 1 (one track per thread) and the device as process 2 (track 1
//! the compute stream, track 2 the copy stream), so both share one time axis.

use super::{Span, Track};
use crate::{Error, Result};
use serde_json::{json, Value};

const HOST_PID: u64 = 1;
const DEVICE_PID: u64 = 2;
const COMPUTE_TID: u64 = 1;
const COPY_TID: u64 = 2;

/// A recorded timeline: host and device spans on one clock (microseconds from its start).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub spans: Vec<Span>,
}

fn ids(track: Track) -> (u64, u64) {
    match track {
        Track::Host(thread) => (HOST_PID, thread),
        Track::Compute => (DEVICE_PID, COMPUTE_TID),
        Track::Copy => (DEVICE_PID, COPY_TID),
    }
}

fn metadata(name: &str, pid: u64, tid: Option<u64>, value: &str) -> Value {
    let mut event = json!({ "name": name, "ph": "M", "pid": pid, "args": { "name": value } });
    if let Some(tid) = tid {
        event["tid"] = json!(tid);
    }
    event
}

impl Trace {
    /// The spans that start at or after `from_us`.
    pub fn since(&self, from_us: f64) -> Trace {
        Trace { spans: self.spans.iter().filter(|s| s.start_us >= from_us).cloned().collect() }
    }

    /// The trace as Chrome trace event JSON.
    pub fn to_json(&self) -> String {
        let mut events = vec![
            metadata("process_name", HOST_PID, None, "host"),
            metadata("process_name", DEVICE_PID, None, "device"),
            metadata("thread_name", DEVICE_PID, Some(COMPUTE_TID), "compute stream"),
            metadata("thread_name", DEVICE_PID, Some(COPY_TID), "copy stream"),
        ];
        let mut threads: Vec<u64> =
            self.spans.iter().filter_map(|s| if let Track::Host(t) = s.track { Some(t) } else { None }).collect();
        threads.sort_unstable();
        threads.dedup();
        for t in threads {
            events.push(metadata("thread_name", HOST_PID, Some(t), &format!("host thread {t}")));
        }
        for span in &self.spans {
            let (pid, tid) = ids(span.track);
            let mut event = json!({
                "name": span.name,
                "cat": span.category,
                "ph": "X",
                "ts": span.start_us,
                "dur": span.dur_us,
                "pid": pid,
                "tid": tid,
            });
            if let Some(detail) = &span.detail {
                event["args"] = json!({ "detail": detail });
            }
            events.push(event);
        }
        let trace = json!({ "traceEvents": events, "displayTimeUnit": "ms" });
        serde_json::to_string_pretty(&trace).expect("a JSON value serializes")
    }

    /// Reads a trace braze wrote (complete events of the host and device processes; other
    /// events, such as metadata, are skipped).
    pub fn from_json(text: &str) -> Result<Trace> {
        let bad = |detail: String| Error::InvalidArgument { op: "Trace::from_json".into(), loc: None, detail };
        let value: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let events = match &value {
            Value::Object(object) => object.get("traceEvents").and_then(Value::as_array),
            Value::Array(events) => Some(events),
            _ => None,
        }
        .ok_or_else(|| bad("expected a JSON object with a `traceEvents` array".into()))?;
        let mut spans = Vec::new();
        for (index, event) in events.iter().enumerate() {
            if event.get("ph").and_then(Value::as_str) != Some("X") {
                continue;
            }
            let number = |key: &str| {
                event
                    .get(key)
                    .and_then(Value::as_f64)
                    .ok_or_else(|| bad(format!("event {index}: expected a number `{key}`, got {:?}", event.get(key))))
            };
            let (pid, tid) = (number("pid")? as u64, number("tid")? as u64);
            let track = match (pid, tid) {
                (HOST_PID, t) => Track::Host(t),
                (DEVICE_PID, COMPUTE_TID) => Track::Compute,
                (DEVICE_PID, COPY_TID) => Track::Copy,
                _ => return Err(bad(format!("event {index}: unknown track pid {pid}, tid {tid}"))),
            };
            spans.push(Span {
                name: event.get("name").and_then(Value::as_str).unwrap_or("").to_string(),
                category: event.get("cat").and_then(Value::as_str).unwrap_or("").to_string(),
                track,
                start_us: number("ts")?,
                dur_us: number("dur")?,
                detail: event.pointer("/args/detail").and_then(Value::as_str).map(str::to_string),
            });
        }
        Ok(Trace { spans })
    }
}
