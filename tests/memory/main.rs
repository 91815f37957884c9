//! Peak memory of hostile input, measured by the kernel (`wait4`'s `ru_maxrss`): compressed
//! bombs under 512 MB, every other hostile fixture and random bytes under 256 MB. One test in
//! its own binary: a child's peak RSS counts the test process at the fork, which must stay
//! small (no other test's buffers alive).

#[path = "../cli/common.rs"]
mod common;

use common::{fixture, measured};

const BOMB_KIB: i64 = 512 << 10;
const HOSTILE_KIB: i64 = 256 << 10;

#[test]
fn hostile_input_stays_within_bounded_memory() {
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(fixture("hostile")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name == "README.md" {
            continue;
        }
        let m = measured(&["summary", path.to_str().unwrap(), "--json"], None);
        assert_eq!(m.signal, None, "{name}: killed by a signal: {}", m.stderr);
        assert!(m.code == Some(0) || m.code == Some(2), "{name}: exit {:?}", m.code);
        let cap = if name.starts_with("bomb_") { BOMB_KIB } else { HOSTILE_KIB };
        assert!(m.max_rss_kib < cap, "{name}: peak RSS {} KiB, over {cap} KiB", m.max_rss_kib);
        seen.push((m.max_rss_kib, name));
    }
    for i in 0..20 {
        let m = measured(&["summary", "/dev/urandom"], None);
        assert_eq!(m.code, Some(2), "{}", m.stderr);
        assert!(m.max_rss_kib < HOSTILE_KIB, "/dev/urandom #{i}: {} KiB: {}", m.max_rss_kib, m.stderr);
        seen.push((m.max_rss_kib, format!("/dev/urandom #{i}")));
    }
    seen.sort();
    for (kib, name) in seen.iter().rev().take(8) {
        println!("{:>7} KiB  {name}", kib);
    }
}
