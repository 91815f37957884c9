//! Writing a JSON document whose one large array (the devices) is built element by element
//! while it is written: a file may list 100 000 devices, and holding every device's JSON tree
//! at once took 1.7 GB for a 280 KB input. The output is byte-identical to building the whole
//! `serde_json::Value` (keys in sorted order, as serde_json's default map writes them), and
//! as safe for a terminal as [`crate::emit::emit_json`]: string contents pass through
//! [`json_safe`], so DEL, C1 and bidi controls are written as `\u` escapes.

use std::io::{self, Write};

use memsnap_model::json_safe;
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::ser::{Formatter, PrettyFormatter};
use serde_json::{Map, Value};

/// serde_json's pretty printer with string contents made terminal-safe.
struct SafePretty(PrettyFormatter<'static>);

impl Formatter for SafePretty {
    fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, fragment: &str) -> io::Result<()> {
        w.write_all(json_safe(fragment).as_bytes())
    }
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}

/// An array serialized from `item(0..len)`, one element alive at a time.
struct LazyArray<'a> {
    len: usize,
    item: &'a dyn Fn(usize) -> Value,
}

impl Serialize for LazyArray<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.len))?;
        for i in 0..self.len {
            seq.serialize_element(&(self.item)(i))?;
        }
        seq.end()
    }
}

/// An object of `fields` plus the lazy array under `key`, entries in sorted key order.
struct Document<'a> {
    fields: &'a Map<String, Value>,
    key: &'a str,
    array: LazyArray<'a>,
}

impl Serialize for Document<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.fields.len() + 1))?;
        let mut placed = false;
        for (k, v) in self.fields {
            if !placed && k.as_str() > self.key {
                map.serialize_entry(self.key, &self.array)?;
                placed = true;
            }
            map.serialize_entry(k, v)?;
        }
        if !placed {
            map.serialize_entry(self.key, &self.array)?;
        }
        map.end()
    }
}

/// Write `fields` with `key: [item(0), …, item(len - 1)]` as pretty JSON and a newline.
pub fn write_pretty(
    out: &mut dyn Write,
    fields: &Map<String, Value>,
    key: &str,
    len: usize,
    item: &dyn Fn(usize) -> Value,
) -> std::io::Result<()> {
    let doc = Document { fields, key, array: LazyArray { len, item } };
    let mut ser = serde_json::Serializer::with_formatter(&mut *out, SafePretty(PrettyFormatter::new()));
    doc.serialize(&mut ser)?;
    out.write_all(b"\n")?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn same_bytes_as_the_whole_value() {
        let items = |i: usize| json!({"device": i, "z": [i, i + 1], "a": null});
        for key in ["aaa", "devices", "zzz"] {
            let fields: Map<String, Value> =
                json!({"b": 1, "command": "x", "y": {"k": [1, 2]}}).as_object().unwrap().clone();
            let mut whole = fields.clone();
            whole.insert(key.into(), Value::Array((0..3).map(items).collect()));
            let want = serde_json::to_string_pretty(&Value::Object(whole)).unwrap() + "\n";
            let mut got = Vec::new();
            write_pretty(&mut got, &fields, key, 3, &items).unwrap();
            assert_eq!(String::from_utf8(got).unwrap(), want, "{key}");
        }
    }

    #[test]
    fn strings_are_terminal_safe_and_keep_their_value() {
        let fields: Map<String, Value> = json!({"name": "a\x1b]0;T\x07\u{9b}\u{202e}b"}).as_object().unwrap().clone();
        let item = |_: usize| json!({"f": "\u{7f}x"});
        let mut got = Vec::new();
        write_pretty(&mut got, &fields, "devices", 1, &item).unwrap();
        let text = String::from_utf8(got).unwrap();
        assert!(text.is_ascii(), "{text}");
        assert!(
            text.contains("\\u001b")
                && text.contains("\\u009b")
                && text.contains("\\u202e")
                && text.contains("\\u007f")
        );
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["name"], fields["name"]);
        assert_eq!(back["devices"][0]["f"], "\u{7f}x");
    }
}
