//! Read one pickle with the sequential and the parallel reader, compare the models and print
//! the times: `cargo run --release -p memsnap-model --example read_both -- FILE`.

use std::time::Instant;

use memsnap_model::{read_snapshot_with, ReadOptions};

fn main() {
    let path = std::env::args().nth(1).expect("usage: read_both FILE.pickle");
    let data = std::fs::read(&path).expect("readable file");
    let t = Instant::now();
    let par = read_snapshot_with(&data, ReadOptions::default()).expect("parallel read");
    let t_par = t.elapsed();
    let t = Instant::now();
    let seq = read_snapshot_with(&data, ReadOptions { sequential: true, ..Default::default() }).expect("read");
    let t_seq = t.elapsed();
    let events: usize = seq.traces.iter().map(|t| t.events.len()).sum();
    println!(
        "{path}: {} bytes, {events} events; sequential {:.3} s, parallel {:.3} s on {} threads ({:.1}% of the bytes, {} windows)",
        data.len(),
        t_seq.as_secs_f64(),
        t_par.as_secs_f64(),
        rayon::current_num_threads(),
        100.0 * par.source.parallel_bytes as f64 / data.len() as f64,
        par.source.parallel_windows
    );
    let same = seq.traces == par.traces
        && seq.strings == par.strings
        && seq.frames == par.frames
        && seq.stacks == par.stacks
        && seq.segments == par.segments
        && seq.source.unknown_keys == par.source.unknown_keys;
    println!("models equal: {same}");
    if !same {
        std::process::exit(1);
    }
}
