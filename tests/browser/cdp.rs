//! A minimal Chrome DevTools Protocol client over `--remote-debugging-pipe`: chromium reads
//! commands from its descriptor 3 and writes replies and events to descriptor 4, each message
//! JSON ended by a NUL byte. No WebDriver, no websocket, no crate beyond serde_json: the pipe is
//! set up by `sh` (`exec 3<&0 4>&1`), so the test needs neither `unsafe` nor chromedriver, and
//! nothing listens on a port.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Where Debian's `chromium` package puts the browser.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// A command that has no reply after this long fails the test (a guard against hanging).
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Browser {
    child: Child,
    stdin: ChildStdin,
    rx: Receiver<Value>,
    next_id: u64,
    /// Events received while waiting for replies, in order.
    pub events: Vec<Value>,
    _profile: tempfile::TempDir,
}

/// The browser, or `None` (with a note on stderr) where it is not installed.
pub fn launch() -> Option<Browser> {
    if !Path::new(CHROMIUM).exists() {
        eprintln!("note: {CHROMIUM} is not installed; skipping the browser test (apt-get install chromium)");
        return None;
    }
    Some(Browser::launch())
}

impl Browser {
    fn launch() -> Browser {
        let profile = tempfile::tempdir().expect("a profile directory");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("exec 3<&0 4>&1 0</dev/null 1>/dev/null; exec \"$0\" \"$@\"")
            .arg(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--mute-audio",
                "--window-size=1280,900",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut buf = Vec::new();
            while r.read_until(0, &mut buf).map(|n| n > 0).unwrap_or(false) {
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
                buf.clear();
            }
        });
        Browser { child, stdin, rx, next_id: 1, events: Vec::new(), _profile: profile }
    }

    /// Send a command (to a page's session, or to the browser) and wait for its result.
    pub fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.stdin.write_all(&bytes).expect("write to chromium");
        self.stdin.flush().unwrap();
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(v) if v["id"] == json!(id) => {
                    assert!(v.get("error").is_none(), "{method}: {}", v["error"]);
                    return v["result"].clone();
                }
                Ok(v) => self.events.push(v),
                Err(RecvTimeoutError::Timeout) => panic!("{method}: no reply from chromium in {REPLY_TIMEOUT:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("{method}: chromium went away"),
            }
        }
    }

    /// Take the events that arrived so far.
    pub fn drain(&mut self) {
        while let Ok(v) = self.rx.try_recv() {
            self.events.push(v);
        }
    }

    /// A new tab with console, network and page events on.
    pub fn page(&mut self) -> Page {
        let target = self.call(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let target = target["targetId"].as_str().unwrap().to_string();
        let s = self.call(None, "Target.attachToTarget", json!({ "targetId": target, "flatten": true }));
        let session = s["sessionId"].as_str().unwrap().to_string();
        for m in ["Page.enable", "Runtime.enable", "Log.enable", "Network.enable"] {
            self.call(Some(&session), m, json!({}));
        }
        let page = Page { session };
        page.resize(self, 1280, 900);
        page
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One tab.
pub struct Page {
    pub session: String,
}

/// What went wrong in a page: console errors, uncaught exceptions, dialogs (an `alert` from
/// injected script), and requests for anything but the page's own file.
pub fn problems(events: &[Value], session: &str, page_url: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e["sessionId"] == json!(session)) {
        let p = &e["params"];
        match e["method"].as_str().unwrap_or("") {
            "Runtime.exceptionThrown" => out.push(format!("exception: {}", p["exceptionDetails"])),
            "Runtime.consoleAPICalled" if matches!(p["type"].as_str(), Some("error" | "assert" | "warning")) => {
                out.push(format!("console.{}: {}", p["type"], p["args"]))
            }
            "Log.entryAdded" if matches!(p["entry"]["level"].as_str(), Some("error" | "warning")) => {
                out.push(format!("log: {}", p["entry"]))
            }
            "Page.javascriptDialogOpening" => out.push(format!("dialog: {}", p["message"])),
            "Network.requestWillBeSent" => {
                let url = p["request"]["url"].as_str().unwrap_or("");
                if url != page_url {
                    out.push(format!("request: {url}"));
                }
            }
            _ => {}
        }
    }
    out
}

impl Page {
    /// Set the viewport's size in CSS pixels.
    pub fn resize(&self, b: &mut Browser, width: u32, height: u32) {
        b.call(
            Some(&self.session),
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        );
    }

    /// Evaluate `expr` in the page and return its value (awaiting a promise).
    pub fn eval(&self, b: &mut Browser, expr: &str) -> Value {
        let r = b.call(
            Some(&self.session),
            "Runtime.evaluate",
            json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {}", r["exceptionDetails"]);
        r["result"]["value"].clone()
    }

    /// Open `file` and wait until the script says it is ready; returns the page's URL and the
    /// time from the command to ready.
    pub fn open(&self, b: &mut Browser, file: &Path) -> (String, Duration) {
        let url = format!("file://{}", file.display());
        let start = Instant::now();
        b.call(Some(&self.session), "Page.navigate", json!({ "url": url }));
        self.wait_for(
            b,
            "document.readyState === 'complete' && document.documentElement.dataset.ready === '1'",
            start + REPLY_TIMEOUT,
        );
        (url, start.elapsed())
    }

    /// Poll the expression `expr` until it is `true`; fails at `deadline`.
    pub fn wait_for(&self, b: &mut Browser, expr: &str, deadline: Instant) {
        while self.eval(b, expr) != json!(true) {
            assert!(Instant::now() < deadline, "not true by the deadline: {expr}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait for two animation frames (the script redraws on the next frame).
    pub fn settle(&self, b: &mut Browser) {
        self.eval(b, "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))");
    }

    fn mouse(&self, b: &mut Browser, kind: &str, x: f64, y: f64, extra: Value) {
        let mut p = json!({ "type": kind, "x": x, "y": y });
        if let (Some(p), Some(e)) = (p.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        b.call(Some(&self.session), "Input.dispatchMouseEvent", p);
    }

    pub fn move_to(&self, b: &mut Browser, x: f64, y: f64) {
        self.mouse(b, "mouseMoved", x, y, json!({}));
    }

    /// A real click (press and release of the left button) at a point of the viewport.
    pub fn click(&self, b: &mut Browser, x: f64, y: f64) {
        self.move_to(b, x, y);
        self.mouse(b, "mousePressed", x, y, json!({ "button": "left", "buttons": 1, "clickCount": 1 }));
        self.mouse(b, "mouseReleased", x, y, json!({ "button": "left", "buttons": 0, "clickCount": 1 }));
    }

    pub fn wheel(&self, b: &mut Browser, x: f64, y: f64, dy: f64) {
        self.mouse(b, "mouseWheel", x, y, json!({ "deltaX": 0, "deltaY": dy }));
    }

    /// The centre of the first element matching `selector`, scrolled into view.
    pub fn centre(&self, b: &mut Browser, selector: &str) -> (f64, f64) {
        let v = self.eval(
            b,
            &format!(
                "(() => {{ const e = document.querySelector({sel}); if (!e) return null; e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; }})()",
                sel = json!(selector)
            ),
        );
        assert!(v.is_array(), "no element {selector}");
        (v[0].as_f64().unwrap(), v[1].as_f64().unwrap())
    }

    pub fn click_on(&self, b: &mut Browser, selector: &str) {
        let (x, y) = self.centre(b, selector);
        self.click(b, x, y);
        self.settle(b);
    }

    /// A PNG of the viewport (or of a part of it, in page coordinates) written to `path`.
    pub fn screenshot(&self, b: &mut Browser, path: &PathBuf, clip: Option<(f64, f64, f64, f64)>) {
        // Within the viewport: capturing beyond it resizes the page, which drops the hover.
        let mut params = json!({ "format": "png", "captureBeyondViewport": false });
        if let Some((x, y, w, h)) = clip {
            params["clip"] = json!({ "x": x, "y": y, "width": w, "height": h, "scale": 1 });
        }
        let r = b.call(Some(&self.session), "Page.captureScreenshot", params);
        let png = base64_decode(r["data"].as_str().unwrap());
        std::fs::write(path, png).unwrap();
    }
}

/// Standard base64 (what CDP sends screenshots in).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => 0,
    };
    let bytes: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let n = chunk.iter().fold(0u32, |acc, &c| (acc << 6) | val(c) as u32) << (6 * (4 - chunk.len()));
        let b = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&b[..3 - pad.min(2).max(if chunk.len() < 4 { 4 - chunk.len() } else { 0 })]);
    }
    out
}

#[test]
fn base64_decodes() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("aGVsbG8h"), b"hello!");
    assert_eq!(base64_decode("aGk="), b"hi");
    assert_eq!(base64_decode("aA=="), b"h");
}
