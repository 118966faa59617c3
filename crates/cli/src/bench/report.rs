//! Result rows: printed as they come, kept for the JSON file, and summed up in a table.

use super::Bench;
use crate::timing::fmt_us;
use serde_json::{json, Value};

impl Bench {
    fn print_row(row: &Value) {
        let s = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let us = row.get("us").and_then(Value::as_f64);
        let time = us.map_or_else(|| "-".to_string(), fmt_us);
        let gbps = row.get("gbps").and_then(Value::as_f64).map_or(String::new(), |g| format!("{g:8.0} GB/s"));
        let mut extra = String::new();
        if let Some(l) = row.get("launches").and_then(Value::as_u64) {
            extra += &format!("  launches={l}");
        }
        if let Some(c) = row.get("check").and_then(Value::as_str) {
            extra += &format!("  check={c}");
        }
        if let Some(n) = row.get("note").and_then(Value::as_str) {
            extra += &format!("  {n}");
        }
        println!(
            "{:12} {:22} {:5} {:28} {:>12} {gbps}{extra}",
            s("workload"),
            s("shape"),
            s("dtype"),
            s("variant"),
            time
        );
    }

    pub(super) fn emit(&mut self, row: Value) {
        Self::print_row(&row);
        self.rows.push(row);
    }

    /// An informational row (`variant` starts with `info`). Its note starts with the measured
    /// time, so readers that print only notes (compare.py) show it; `us` is `None` where the row
    /// holds no time, and a note starting `not measured:` says why.
    pub(super) fn info(
        &mut self,
        workload: &str,
        shape: &str,
        dtype: &str,
        variant: &str,
        us: Option<f64>,
        note: &str,
    ) {
        let note = match us {
            Some(us) => format!("{}: {note}", fmt_us(us)),
            None => note.to_string(),
        };
        self.emit(json!({
            "workload": workload, "shape": shape, "dtype": dtype, "variant": variant,
            "us": us, "gbps": null, "note": note,
        }));
    }

    pub(super) fn print_table(&self) {
        println!();
        println!(
            "{:12} {:22} {:5} {:28} {:>12} {:>9} {:>6} {:>9} {:>6}",
            "workload", "shape", "dtype", "variant", "time", "GB/s", "%copy", "launches", "check"
        );
        for row in &self.rows {
            let s = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let variant = s("variant");
            if variant.starts_with("info") && variant != "info braze copy" {
                continue;
            }
            let us = row.get("us").and_then(Value::as_f64);
            let gbps = row.get("gbps").and_then(Value::as_f64);
            let pct = match (gbps, self.copy_gbps) {
                (Some(g), Some(c)) => format!("{:.1}", 100.0 * g / c),
                _ => "-".into(),
            };
            let launches = match (row.get("launches").and_then(Value::as_u64), row.get("launch_target_met")) {
                (Some(l), Some(Value::Bool(false))) => format!("{l} (!)"),
                (Some(l), _) => l.to_string(),
                _ => "-".into(),
            };
            println!(
                "{:12} {:22} {:5} {:28} {:>12} {:>9} {:>6} {:>9} {:>6}",
                s("workload"),
                s("shape"),
                s("dtype"),
                variant,
                us.map_or_else(|| "-".to_string(), fmt_us),
                gbps.map_or_else(|| "-".to_string(), |g| format!("{g:.0}")),
                pct,
                launches,
                row.get("check").and_then(Value::as_str).unwrap_or("-")
            );
        }
        let infos: Vec<&Value> = self
            .rows
            .iter()
            .filter(|r| r["variant"].as_str().is_some_and(|v| v.starts_with("info") && v != "info braze copy"))
            .collect();
        if !infos.is_empty() {
            println!();
            for row in infos {
                println!(
                    "{:12} {:22} {:5} {:26} {}",
                    row["workload"].as_str().unwrap_or(""),
                    row["shape"].as_str().unwrap_or(""),
                    row["dtype"].as_str().unwrap_or(""),
                    row["variant"].as_str().unwrap_or(""),
                    row["note"].as_str().unwrap_or("")
                );
            }
        }
    }
}
