//! Reading throughput (bytes of pickle per second) on real snapshots.
//!
//! Inputs: the bundled fixtures (always), and `../shared/bench/huge_python_stacks.pickle.xz`
//! (87 MB, 1 M events) when the shared folder is beside the checkout; it is unpacked once into
//! `target/bench-inputs/`, never into the source tree. Paired runs against Python's
//! `pickle.load` use `../shared/bin/bench-vs-python` (see docs/performance.md).

use std::io::Read;
use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn unxz(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    let f = std::fs::File::open(path).expect("open input");
    xz2::read::XzDecoder::new_multi_decoder(f).read_to_end(&mut out).expect("xz");
    out
}

fn inputs() -> Vec<(String, Vec<u8>)> {
    let mut v = vec![
        ("s03_loss_history_leak".to_string(), unxz(&root().join("fixtures/dev/s03_loss_history_leak.pickle.xz"))),
        ("cpp_pickler".to_string(), unxz(&root().join("fixtures/dev/cpp_pickler.cpp.pickle.xz"))),
    ];
    let huge = root().join("../shared/bench/huge_python_stacks.pickle.xz");
    if huge.exists() {
        let cache = root().join("target/bench-inputs/huge_python_stacks.pickle");
        let data = match std::fs::read(&cache) {
            Ok(d) => d,
            Err(_) => {
                let d = unxz(&huge);
                std::fs::create_dir_all(cache.parent().expect("parent")).expect("mkdir");
                std::fs::write(&cache, &d).expect("cache");
                d
            }
        };
        v.push(("huge_python_stacks".to_string(), data));
    } else {
        eprintln!("note: ../shared/bench not found; benchmarking the bundled fixtures only");
    }
    v
}

fn bench_read(c: &mut Criterion) {
    let mut g = c.benchmark_group("read_snapshot");
    g.sample_size(10);
    for (name, data) in inputs() {
        g.throughput(Throughput::Bytes(data.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(&name), &data, |b, d| {
            b.iter(|| memsnap_model::read_snapshot(d).expect("readable"))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_read);
criterion_main!(benches);
