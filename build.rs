//! Tells the tests whether the shared data folder (`../shared`, beside the checkout) is here.
//! Tests that need it carry `#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside
//! the checkout")]`, so a fresh clone lists them as ignored instead of passing them silently, and
//! CI (which has the folder) runs them. Adding the folder later: `touch build.rs` to re-detect.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(memsnap_shared)");
    println!("cargo::rerun-if-changed=build.rs");
    let dev = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/snapshots/dev");
    if dev.is_dir() {
        println!("cargo::rerun-if-changed={}", dev.display());
        println!("cargo::rustc-cfg=memsnap_shared");
    }
}
