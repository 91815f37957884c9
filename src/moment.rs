//! One grammar for "a moment in the trace" (`--at`), shared by every command that takes one:
//!
//! | `--at` | the moment |
//! | --- | --- |
//! | `start` | before the first event |
//! | `peak` | after the event at which allocated bytes were first highest |
//! | `end` | after the last event (what the dump holds) |
//! | `oom` | after the last out-of-memory event |
//! | `event:N` | after event N (numbered from 0, as `trace` and `analyze` number them) |
//! | `+1.25s`, `+300ms`, `+40us` | after the last event at or before that long after the first timed event |
//! | `iteration:K` | after the last event of iteration K (from 1, as `analyze` counts them) |
//! | `us:EPOCH` | after the last event at or before `time_us` EPOCH (as the JSON prints times) |
//!
//! A moment outside the trace (an event past the end, a time before the start or after the
//! end, an iteration that does not exist, no OOM) is an error that says the valid range. A bare
//! number is refused as ambiguous: it used to be read as epoch microseconds, silently.

use memsnap_model::{Action, TraceEvent};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    Start,
    Peak,
    End,
    Oom,
    Event(u64),
    /// Microseconds after the first timed event.
    After(i64),
    /// 1-based.
    Iteration(u64),
    Epoch(i64),
}

const GRAMMAR: &str = "start, peak, end, oom, event:N, +1.25s / +300ms / +40us, iteration:K or us:EPOCH";

/// Parse `--at` (a clap value parser).
pub fn parse(s: &str) -> Result<At, String> {
    let bad = |why: &str| format!("`{s}`: {why}; expected {GRAMMAR}");
    let number = |n: &str| n.parse::<u64>().map_err(|_| bad("not a whole number"));
    match s {
        "start" => return Ok(At::Start),
        "peak" => return Ok(At::Peak),
        "end" => return Ok(At::End),
        "oom" => return Ok(At::Oom),
        _ => {}
    }
    if let Some(n) = s.strip_prefix("event:") {
        return number(n).map(At::Event);
    }
    if let Some(n) = s.strip_prefix("iteration:") {
        return match number(n)? {
            0 => Err(bad("iterations are counted from 1")),
            k => Ok(At::Iteration(k)),
        };
    }
    if let Some(n) = s.strip_prefix("us:") {
        return n.parse::<i64>().map(At::Epoch).map_err(|_| bad("not a time in microseconds"));
    }
    if let Some(rel) = s.strip_prefix('+') {
        return relative_us(rel).map(At::After).ok_or_else(|| bad("not a duration such as +1.25s, +300ms or +40us"));
    }
    if s.parse::<f64>().is_ok() {
        return Err(bad("a bare number is ambiguous (use event:N, +Ns or us:EPOCH)"));
    }
    Err(bad("unknown moment"))
}

/// `1.25s`, `300ms`, `40us` → microseconds (rounded to the nearest).
fn relative_us(s: &str) -> Option<i64> {
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1_000.0)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1_000_000.0)
    } else {
        return None;
    };
    let v: f64 = num.parse().ok().filter(|v: &f64| v.is_finite() && *v >= 0.0 && !num.starts_with(['+', '-']))?;
    let us = (v * scale).round();
    (us <= i64::MAX as f64 / 2.0).then_some(us as i64)
}

impl At {
    /// The name shown in outputs (the text given, normalised).
    pub fn name(self) -> String {
        match self {
            At::Start => "start".into(),
            At::Peak => "peak".into(),
            At::End => "end".into(),
            At::Oom => "oom".into(),
            At::Event(n) => format!("event:{n}"),
            At::After(us) => format!("+{}s", us as f64 / 1e6),
            At::Iteration(k) => format!("iteration:{k}"),
            At::Epoch(t) => format!("us:{t}"),
        }
    }

    /// The event after which the moment is, on one device (`None`: before the first event).
    /// `peak` is the device's peak event; `iteration_starts` the event indices where iterations
    /// start (asked for only by `iteration:K`).
    pub fn resolve(
        self,
        events: &[TraceEvent],
        peak: Option<usize>,
        iteration_starts: impl FnOnce() -> Vec<u32>,
    ) -> Result<Option<usize>, String> {
        let last = events.len().checked_sub(1);
        let range = || match last {
            Some(l) => format!("this device's trace has events 0 to {l}"),
            None => "this device's trace is empty".into(),
        };
        let first_time = events.iter().find(|e| e.has_time()).map(|e| e.time_us);
        let last_time = events.iter().rev().find(|e| e.has_time()).map(|e| e.time_us);
        let at_time = |t: i64| -> Result<Option<usize>, String> {
            let (Some(t0), Some(t1)) = (first_time, last_time) else {
                return Err(format!("--at {}: the trace has no times (time_us); use event:N", self.name()));
            };
            if t < t0 || t > t1 {
                return Err(format!(
                    "--at {}: outside the trace, which runs from us:{t0} to us:{t1} (+0s to +{}s)",
                    self.name(),
                    (t1 - t0) as f64 / 1e6
                ));
            }
            Ok(memsnap_replay::event_at_time(events, t))
        };
        match self {
            At::Start => Ok(None),
            At::Peak => Ok(peak.or(last)),
            At::End => Ok(last),
            At::Oom => events
                .iter()
                .rposition(|e| e.action() == Action::Oom)
                .map(Some)
                .ok_or_else(|| "--at oom: no out-of-memory event in this device's trace".to_string()),
            At::Event(n) => match last {
                Some(l) if n <= l as u64 => Ok(Some(n as usize)),
                _ => Err(format!("--at event:{n}: past the end; {}", range())),
            },
            At::After(us) => match first_time {
                Some(t0) => at_time(t0.saturating_add(us)),
                None => at_time(0),
            },
            At::Epoch(t) => at_time(t),
            At::Iteration(k) => {
                let starts = iteration_starts();
                let n = starts.len() as u64;
                if k > n {
                    return Err(format!(
                        "--at iteration:{k}: {}",
                        if n == 0 {
                            "no iterations were found".to_string()
                        } else {
                            format!("there are iterations 1 to {n}")
                        }
                    ));
                }
                let end = starts.get(k as usize).map_or(events.len(), |&s| s as usize);
                Ok(end.checked_sub(1))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(action: Action, t: i64) -> TraceEvent {
        let mut e = TraceEvent::new(action, 0);
        e.time_us = t;
        e
    }

    #[test]
    fn grammar() {
        assert_eq!(parse("peak"), Ok(At::Peak));
        assert_eq!(parse("event:5000"), Ok(At::Event(5000)));
        assert_eq!(parse("+1.25s"), Ok(At::After(1_250_000)));
        assert_eq!(parse("+300ms"), Ok(At::After(300_000)));
        assert_eq!(parse("+40us"), Ok(At::After(40)));
        assert_eq!(parse("iteration:3"), Ok(At::Iteration(3)));
        assert_eq!(parse("us:1795964642252412"), Ok(At::Epoch(1_795_964_642_252_412)));
        for bad in ["12", "noon", "event:", "event:-1", "iteration:0", "+1.5", "+-1s", "us:x", "+nans"] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("expected start, peak, end, oom"), "{bad}: {e}");
        }
        assert!(parse("12").unwrap_err().contains("ambiguous"));
    }

    #[test]
    fn ranges() {
        let events: Vec<TraceEvent> =
            [(Action::Alloc, 100), (Action::Alloc, 200), (Action::Oom, 300), (Action::FreeCompleted, 400)]
                .iter()
                .map(|&(a, t)| ev(a, t))
                .collect();
        let none = Vec::new;
        assert_eq!(At::Start.resolve(&events, Some(1), none), Ok(None));
        assert_eq!(At::Peak.resolve(&events, Some(1), none), Ok(Some(1)));
        assert_eq!(At::End.resolve(&events, Some(1), none), Ok(Some(3)));
        assert_eq!(At::Oom.resolve(&events, None, none), Ok(Some(2)));
        assert_eq!(At::Event(3).resolve(&events, None, none), Ok(Some(3)));
        assert!(At::Event(4).resolve(&events, None, none).unwrap_err().contains("events 0 to 3"));
        assert_eq!(At::After(150).resolve(&events, None, none), Ok(Some(1)));
        assert_eq!(At::Epoch(100).resolve(&events, None, none), Ok(Some(0)));
        assert!(At::Epoch(12).resolve(&events, None, none).unwrap_err().contains("outside the trace"));
        assert!(At::After(301).resolve(&events, None, none).unwrap_err().contains("+0s to +0.0003s"));
        assert_eq!(At::Iteration(1).resolve(&events, None, || vec![0, 2]), Ok(Some(1)));
        assert_eq!(At::Iteration(2).resolve(&events, None, || vec![0, 2]), Ok(Some(3)));
        assert!(At::Iteration(3).resolve(&events, None, || vec![0, 2]).unwrap_err().contains("iterations 1 to 2"));
        assert!(At::Oom.resolve(&events[..2], None, none).is_err());
    }
}
