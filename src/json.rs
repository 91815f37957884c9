//! JSON builders shared by the commands' `--json` outputs (the schema is docs/json.md).

use memsnap_analysis::{Site, Suspect};
use serde_json::{json, Value};

pub fn site_json(s: &Site) -> Value {
    json!({"filename": s.filename, "line": s.line, "function": s.function})
}

pub fn suspect_json(s: &Suspect) -> Value {
    json!({
        "kind": s.kind.name(),
        "severity": s.severity.name(),
        "confidence": (s.confidence * 100.0).round() / 100.0,
        "device": s.device,
        "bytes": s.bytes,
        "bytes_at_peak": s.bytes_at_peak,
        "growth_bytes_per_iteration": s.growth_bytes_per_iteration,
        "growth_unit": s.growth_unit.name(),
        "peak_allocated_bytes_without": s.peak_without,
        "site": s.site.as_ref().map(site_json),
        "stack": s.stack.iter().map(site_json).collect::<Vec<_>>(),
        "evidence": s.evidence,
        "advice": s.advice,
        "facts": serde_json::to_value(&s.facts).unwrap_or(Value::Null),
    })
}
