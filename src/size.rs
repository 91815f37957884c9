//! Byte sizes on the command line: parsing `1GiB`, `500MB`, `1.5G`, `1048576`, and printing
//! them back.
//!
//! Units are case-insensitive and may be separated from the number by spaces:
//! - none or `B`: bytes;
//! - `kB`/`KB`, `MB`, `GB`, `TB`, `PB`: decimal, powers of 1000 (as disk and network vendors use);
//! - `KiB`, `MiB`, `GiB`, `TiB`, `PiB`: binary, powers of 1024 (as PyTorch reports memory);
//! - `K`, `M`, `G`, `T`, `P` alone: binary (as `ls -h`, `free -h` and Docker's `--memory` read
//!   them), so `1.5G` is 1.5 × 2³⁰ = 1,610,612,736 bytes.
//!
//! Fractions are exact (no floating point) and rounded to the nearest byte.

/// Parse a size; the error says what is accepted.
pub fn parse(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = (&s[..split], s[split..].trim());
    let bad = || {
        format!("invalid size {text:?}: expected a number of bytes with an optional unit, e.g. 1073741824, 1GiB, 500MB, 1.5G (K/M/G/T alone are binary)")
    };
    let mult: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "p" | "pib" => 1 << 50,
        _ => return Err(bad()),
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') || int.len() > 20 || frac.len() > 18 {
        return Err(bad());
    }
    let digits = |d: &str| if d.is_empty() { Ok(0u128) } else { d.parse::<u128>().map_err(|_| bad()) };
    let scale = 10u128.pow(frac.len() as u32);
    let scaled = digits(int)? * scale + digits(frac)?;
    // Round half up to whole bytes.
    let too_big = || format!("invalid size {text:?}: larger than {} bytes", u64::MAX);
    let bytes = scaled.checked_mul(mult).and_then(|v| v.checked_add(scale / 2)).ok_or_else(too_big)? / scale;
    u64::try_from(bytes).map_err(|_| too_big())
}

/// `1.50 GiB`, `512 B`: binary units with two decimals, as the other commands print sizes.
pub fn format(b: u64) -> String {
    memsnap_model::format_bytes(b, 2)
}

/// A change in bytes with its sign: `+1.50 GiB`, `-512 B`, `0 B`.
pub fn format_change(d: i128) -> String {
    let abs = format(u64::try_from(d.unsigned_abs()).unwrap_or(u64::MAX));
    match d.signum() {
        1 => format!("+{abs}"),
        -1 => format!("-{abs}"),
        _ => abs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("1048576", 1 << 20),
            ("12B", 12),
            ("1KiB", 1024),
            ("1kb", 1000),
            ("500MB", 500_000_000),
            ("500 MiB", 500 << 20),
            ("1GiB", 1 << 30),
            ("1GB", 1_000_000_000),
            ("1.5G", 1_610_612_736),
            ("1.5g", 1_610_612_736),
            ("2T", 2 << 40),
            (".5K", 512),
            ("1.", 1),
            ("0.0001KB", 0),
            ("0.0005KB", 1),
            (" 20GiB ", 20 << 30),
            ("18446744073709551615", u64::MAX),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Ok(*want), "{text}");
        }
    }

    #[test]
    fn rejects() {
        for text in [
            "",
            "GiB",
            ".",
            "1..5G",
            "1.5.2G",
            "-1",
            "1e9",
            "1 GiBs",
            "1 Mbit",
            "18446744073709551616",
            "99999999999999999999.999999999999999999P",
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains("invalid size"), "{text}: {err}");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format(512), "512 B");
        assert_eq!(format(1536), "1.50 KiB");
        assert_eq!(format_change(-(1 << 30)), "-1.00 GiB");
        assert_eq!(format_change(3), "+3 B");
        assert_eq!(format_change(0), "0 B");
    }
}
