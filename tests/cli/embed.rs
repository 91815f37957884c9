//! The command line run in-process (`memsnap::embed`, what the Python extension calls): the
//! same bytes and exit status as the binary, inputs handed over as bytes, and runs on several
//! threads at once that keep their outputs and inputs apart.

use memsnap::embed::{run_captured, Captured};

use crate::common::{fixture, memsnap_env};

fn captured(args: &[&str], inputs: Vec<(String, Vec<u8>)>) -> Captured {
    let argv = std::iter::once("memsnap").chain(args.iter().copied()).map(String::from).collect();
    run_captured(argv, inputs)
}

fn rel(name: &str) -> String {
    format!("fixtures/{name}")
}

const LEAK: &str = "dev/s03_loss_history_leak.pickle.xz";
const CLEAN: &str = "dev/s01_clean_train.pickle.xz";

#[test]
fn captured_runs_equal_the_binary() {
    let (leak, clean) = (rel(LEAK), rel(CLEAN));
    let cases: Vec<Vec<&str>> = vec![
        vec!["analyze", &leak, "--json"],
        vec!["summary", &clean],
        vec!["summary", &clean, "--json"],
        vec!["timeline", &clean, "--csv", "--every", "25"],
        vec!["timeline", &clean, "--json", "--every", "25"],
        vec!["check", &leak, "--fail-on", "leaks"],
        vec!["check", &clean, "--max-peak", "20GiB"],
        vec!["diff", &clean, &leak, "--json"],
        vec!["batch", &clean, "fixtures/hostile/empty.pickle"],
        vec!["analyze", "fixtures/hostile/truncated_at_100.pickle"],
        vec!["analyze", "no/such.pickle"],
        vec!["--help"],
        vec!["--version"],
        vec!["bogus"],
        vec![],
        vec!["docs"],
    ];
    for args in cases {
        // The binary with COLUMNS set as this process has it: text output wraps by it.
        let columns = std::env::var("COLUMNS").ok();
        let env: Vec<(&str, &str)> = columns.as_deref().map(|c| ("COLUMNS", c)).into_iter().collect();
        let want = memsnap_env(None, &args, None, &env);
        let got = captured(&args, Vec::new());
        assert_eq!(Some(i32::from(got.code)), want.code, "{args:?}: {}", want.stderr);
        assert_eq!(got.stdout, want.stdout_bytes, "{args:?}");
        assert_eq!(got.stderr, want.stderr_bytes, "{args:?}");
    }
}

#[test]
fn bytes_handed_over_read_as_the_file() {
    let data = std::fs::read(fixture(LEAK)).unwrap();
    let from_file = captured(&["analyze", &rel(LEAK), "--json"], Vec::new());
    let from_bytes = captured(&["analyze", "<bytes>", "--json"], vec![("<bytes>".into(), data.clone())]);
    assert_eq!((from_bytes.code, &from_bytes.stderr[..]), (0, &b""[..]));
    let mut a: serde_json::Value = serde_json::from_slice(&from_file.stdout).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&from_bytes.stdout).unwrap();
    assert_eq!(b["file"], "<bytes>");
    a["file"] = b["file"].clone();
    assert_eq!(a, b);

    // An unreadable one is named as it was handed over.
    let bad = captured(&["summary", "<bytes>"], vec![("<bytes>".into(), data[..5000].to_vec())]);
    assert_eq!(bad.code, 2);
    let line = String::from_utf8(bad.stderr).unwrap();
    assert!(
        line.starts_with("memsnap: error: <bytes>: ") && line.ends_with('\n') && line.lines().count() == 1,
        "{line}"
    );

    // Two inputs by their names, and a batch row of one.
    let clean = std::fs::read(fixture(CLEAN)).unwrap();
    let diff = captured(&["diff", "a", "b", "--json"], vec![("a".into(), clean.clone()), ("b".into(), data)]);
    let want = memsnap_env(None, &["diff", &rel(CLEAN), &rel(LEAK), "--json"], None, &[]);
    let renamed = String::from_utf8(diff.stdout).unwrap().replace("\"a\"", "\"s01_clean_train.pickle.xz\"");
    assert_eq!(renamed.replace("\"b\"", "\"s03_loss_history_leak.pickle.xz\""), want.stdout);
    let row = captured(&["batch", "runs/x.pickle.xz"], vec![("runs/x.pickle.xz".into(), clean)]);
    let want = memsnap_env(None, &["batch", &rel(CLEAN)], None, &[]);
    assert_eq!(String::from_utf8(row.stdout).unwrap().replace("runs/x.pickle.xz", &rel(CLEAN)), want.stdout);
}

#[test]
fn threads_keep_their_outputs_and_inputs_apart() {
    let leak = std::fs::read(fixture(LEAK)).unwrap();
    let clean = std::fs::read(fixture(CLEAN)).unwrap();
    // Same name, different bytes on each thread; errors on some.
    let work = move |i: usize| {
        let data = match i % 3 {
            0 => leak.clone(),
            1 => clean.clone(),
            _ => leak[..3000].to_vec(),
        };
        let c = captured(&["batch", "same.pickle.xz", "--jobs", "2"], vec![("same.pickle.xz".into(), data)]);
        (c.code, String::from_utf8(c.stdout).unwrap(), String::from_utf8(c.stderr).unwrap())
    };
    let alone: Vec<_> = (0..3).map(&work).collect();
    assert_eq!(alone.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 0, 2]);
    let work = std::sync::Arc::new(work);
    let threads: Vec<_> = (0..12)
        .map(|i| {
            let work = work.clone();
            std::thread::spawn(move || (i, work(i)))
        })
        .collect();
    for t in threads {
        let (i, got) = t.join().unwrap();
        assert_eq!(got, alone[i % 3], "thread {i}");
    }
}
