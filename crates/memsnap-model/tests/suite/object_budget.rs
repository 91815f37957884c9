//! The object budget (`memsnap_pickle::ObjectBudget`) is far from what real snapshots build:
//! every bundled real fixture is read as a stream with its compressed bytes counted, and the
//! memory its objects took must stay under a quarter of the budget's proportional parts alone
//! (without the fixed allowance, which small files would hide behind).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use memsnap_model::{read_snapshot_from, ReadOptions};
use memsnap_pickle::{CountingReader, ObjectBudget};

fn real_fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut out = Vec::new();
    for dir in ["dev", "extra", "extra2", "extra3", "extra4"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.to_string_lossy().ends_with(".pickle.xz") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn real_snapshots_build_a_small_fraction_of_the_budget() {
    let files = real_fixtures();
    assert!(files.len() >= 60, "expected the bundled real fixtures, found {}", files.len());
    check_budget(&files);
}

#[test]
#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside the checkout")]
fn the_87_mb_bench_file_builds_a_small_fraction_of_the_budget() {
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench/huge_python_stacks.pickle.xz");
    assert!(bench.is_file(), "{} is absent", bench.display());
    check_budget(&[bench]);
}

fn check_budget(files: &[PathBuf]) {
    let budget = ObjectBudget::DEFAULT;
    let (mut worst_pickle, mut worst_stored) = (0f64, 0f64);
    for path in files {
        let (file, stored) = CountingReader::new(std::fs::File::open(path).unwrap());
        let (mut pickle, pickle_count) = CountingReader::new(xz2::read::XzDecoder::new(file));
        let opts = ReadOptions { stored_bytes: Some(stored.clone()), ..ReadOptions::default() };
        let snap = read_snapshot_from(&mut pickle, opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        std::io::copy(&mut pickle, &mut std::io::sink()).unwrap();
        let built = snap.source.peak_built_bytes as f64;
        assert!(built > 0.0, "{}: nothing counted", path.display());
        let per_pickle = built / pickle_count.load(Ordering::Relaxed) as f64;
        let per_stored = built / stored.load(Ordering::Relaxed) as f64;
        worst_pickle = worst_pickle.max(per_pickle);
        worst_stored = worst_stored.max(per_stored);
        println!("{per_pickle:.2} per pickle byte, {per_stored:.1} per xz byte: {}", path.display());
        assert!(
            per_pickle * 4.0 <= budget.per_pickle_byte as f64 && per_stored * 4.0 <= budget.per_stored_byte as f64,
            "{}: builds {per_pickle:.2} bytes per pickle byte and {per_stored:.1} per stored byte, too close to the budget",
            path.display()
        );
    }
    println!(
        "{} real snapshots: at most {worst_pickle:.2} bytes of objects per pickle byte, {worst_stored:.1} per xz byte",
        files.len()
    );
}
