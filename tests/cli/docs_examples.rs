//! The console examples in the docs are real runs: a ```console block after the marker
//! `<!-- checked: tests/cli/docs_examples.rs -->` is run here (each `$ memsnap …` line, from the
//! repository root) and its output must be what the doc shows, so the docs cannot drift from
//! the binary. A line `…` in the doc stands for any number of lines; `$ echo $?` checks the exit
//! code of the command before it.

use crate::common;

use common::{memsnap, root};

const MARKER: &str = "<!-- checked: tests/cli/docs_examples.rs -->";

/// (doc, command line, expected output lines, expected exit code) for every checked command.
fn examples() -> Vec<(String, String, Vec<String>, Option<i32>)> {
    let mut out = Vec::new();
    let mut docs: Vec<_> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.push(root().join("README.md"));
    docs.sort();
    for doc in docs {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.file_name().unwrap().to_string_lossy().into_owned();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(MARKER) {
            let after = &rest[at + MARKER.len()..];
            let start = after.find("```console\n").expect("a console block after the marker") + "```console\n".len();
            let end = after[start..].find("\n```").expect("the end of the block") + start;
            let block: Vec<&str> = after[start..end].lines().collect();
            let mut i = 0;
            while i < block.len() {
                let cmd = block[i].strip_prefix("$ ").unwrap_or_else(|| panic!("{name}: expected `$ memsnap …`"));
                let mut expected = Vec::new();
                i += 1;
                while i < block.len() && !block[i].starts_with("$ ") {
                    expected.push(block[i].to_string());
                    i += 1;
                }
                let mut code = None;
                if i < block.len() && block[i] == "$ echo $?" {
                    code = Some(block[i + 1].parse().unwrap());
                    i += 2;
                }
                out.push((name.clone(), cmd.to_string(), expected, code));
            }
            rest = &after[end..];
        }
    }
    out
}

/// `actual` as the doc shows it, with `…` lines standing for any run of lines.
fn matches(expected: &[String], actual: &[&str]) -> bool {
    let (mut e, mut a) = (0, 0);
    while e < expected.len() {
        if expected[e].trim() == "…" {
            let Some(next) = expected.get(e + 1) else { return true };
            match actual[a..].iter().position(|l| l == next) {
                Some(k) => a += k,
                None => return false,
            }
            e += 1;
            continue;
        }
        if actual.get(a) != Some(&expected[e].as_str()) {
            return false;
        }
        e += 1;
        a += 1;
    }
    a == actual.len()
}

#[test]
fn console_examples_in_the_docs_are_what_the_binary_prints() {
    let examples = examples();
    assert!(examples.len() >= 2, "no checked examples found");
    let mut failures = Vec::new();
    for (doc, cmd, expected, code) in &examples {
        let args: Vec<&str> = cmd.split_whitespace().collect();
        assert_eq!(args[0], "memsnap", "{doc}: only memsnap commands are run: {cmd}");
        let run = memsnap(&args[1..]);
        let text = format!("{}{}", run.stdout, run.stderr);
        let actual: Vec<&str> = text.lines().collect();
        if !matches(expected, &actual) {
            failures.push(format!("{doc}: `{cmd}` printed:\n{text}"));
        }
        if let Some(code) = code {
            if run.code != Some(*code) {
                failures.push(format!("{doc}: `{cmd}` exited {:?}, the doc says {code}", run.code));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn ellipsis_lines_stand_for_any_lines() {
    let e = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(matches(&e(&["a", "…", "d"]), &["a", "b", "c", "d"]));
    assert!(matches(&e(&["a", "  …", "d"]), &["a", "d"]));
    assert!(!matches(&e(&["a", "…", "d"]), &["a", "b"]));
    assert!(!matches(&e(&["a"]), &["a", "b"]));
    assert!(matches(&e(&["a", "…"]), &["a", "b"]));
}
