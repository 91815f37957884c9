//! The interactive page: the static report's HTML with a Content-Security-Policy that forbids
//! every fetch, each device's part wrapped in a `<section>` the script can find, the page's CSS,
//! the data blob and the script. Without scripts the page reads as the static report.

use super::{blob, data};
use crate::{Report, ReportInput};

/// The script (vanilla JavaScript, no library) and its styles, embedded at build time.
const APP_JS: &str = include_str!("app.js");
const APP_CSS: &str = include_str!("app.css");

/// No fetch of any kind (`default-src 'none'`): the page draws everything from the blob with the
/// inline script and styles. A browser that honours it refuses a request even if one were made.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'";

/// Where the static page's device parts end: its caveats card (see `html::render`).
const CAVEATS_CARD: &str = "<div class=\"card\">\n<h3>Caveats</h3>";
const DEVICE_HEADING: &str = "<h2>Device ";

/// The interactive page of `report`, which [`crate::build`] made from `input`.
pub fn page(input: &ReportInput<'_>, report: &Report) -> String {
    page_with(input, report, &data::Detail::default())
}

/// [`page`] with more of the trace embedded event by event ([`data::Detail`]).
pub fn page_with(input: &ReportInput<'_>, report: &Report, detail: &data::Detail) -> String {
    let (data, html) = rayon::join(|| data::build(input, detail), || crate::html::render(report));
    assemble(&html, &blob::to_script_text(&data))
}

/// The report of `input` ([`crate::build`]) as the interactive page ([`page_with`]), the report
/// and the page's data built side by side.
pub fn build_page(input: &ReportInput<'_>, opts: &crate::ReportOptions, detail: &data::Detail) -> String {
    let (report, data) = rayon::join(|| crate::build(input, opts), || data::build(input, detail));
    assemble(&crate::html::render(&report), &blob::to_script_text(&data))
}

/// Put the blob and the script into the static page `html`. Snapshot strings in `html` are
/// escaped, so the markers searched for below can only be the page's own.
fn assemble(html: &str, blob: &str) -> String {
    let mut s = String::with_capacity(html.len() + blob.len() + APP_JS.len() + APP_CSS.len() + 512);
    let head_end = html.find("</head>").unwrap_or(0);
    let (head, body) = html.split_at(head_end);
    let charset = "<meta charset=\"utf-8\">\n";
    match head.find(charset) {
        Some(at) => {
            let at = at + charset.len();
            s.push_str(&head[..at]);
            s.push_str(&format!("<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"));
            s.push_str(&head[at..]);
        }
        None => s.push_str(head),
    }
    s.push_str("<style>");
    s.push_str(APP_CSS);
    s.push_str("</style>\n");

    // Wrap each device's part, from its heading to the next device's or to the caveats card.
    let end_of_devices = body.find(CAVEATS_CARD).unwrap_or(body.len());
    let (devices, rest) = body.split_at(end_of_devices);
    let mut parts = devices.split(DEVICE_HEADING);
    s.push_str(parts.next().unwrap_or(""));
    for part in parts {
        let device: String = part.chars().take_while(|c| c.is_ascii_digit()).collect();
        s.push_str(&format!(
            "<section class=\"ms-device\" data-device=\"{device}\">\n{DEVICE_HEADING}{part}</section>\n"
        ));
    }
    let body_end = rest.rfind("</body>").unwrap_or(rest.len());
    s.push_str(&rest[..body_end]);
    s.push_str("<script type=\"application/json\" id=\"memsnap-data\">");
    s.push_str(blob);
    s.push_str("</script>\n<script>\n");
    s.push_str(APP_JS);
    s.push_str("</script>\n");
    s.push_str(&rest[body_end..]);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_and_styles_cannot_end_their_elements() {
        // Inside <script> and <style> the parser looks for these; the embedded text has none.
        for bad in ["</script", "<script", "<!--", "</style"] {
            assert!(!APP_JS.to_ascii_lowercase().contains(bad), "{bad} in app.js");
            assert!(!APP_CSS.to_ascii_lowercase().contains(bad), "{bad} in app.css");
        }
        // Text from the snapshot goes in as text only, and nothing is fetched.
        for api in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "fetch(",
            "XMLHttpRequest",
            "import(",
        ] {
            assert!(!APP_JS.contains(api), "app.js uses {api}");
        }
    }

    #[test]
    fn devices_are_wrapped_and_the_script_comes_last() {
        let html = "<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n<title>t</title>\n</head>\n<body>\n<main>\n<h1>x</h1>\n<h2>Device 0</h2>\na\n<h2>Device 1</h2>\nb\n<div class=\"card\">\n<h3>Caveats</h3>\n</div>\n</main>\n</body>\n</html>\n";
        let page = assemble(html, "{}");
        assert!(page.contains("<section class=\"ms-device\" data-device=\"0\">\n<h2>Device 0</h2>\na\n</section>"));
        assert!(page.contains("<section class=\"ms-device\" data-device=\"1\">\n<h2>Device 1</h2>\nb\n</section>"));
        assert!(page.contains("Content-Security-Policy"));
        let script = page.find("id=\"memsnap-data\">{}</script>").unwrap();
        assert!(script > page.find("<h3>Caveats</h3>").unwrap());
        assert!(page.ends_with("</script>\n</body>\n</html>\n"));
    }
}
