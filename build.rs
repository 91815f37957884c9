//! Tells the tests whether the shared data folder (`../shared`, beside the checkout) is here.
//! Tests that need it carry `#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside
//! the checkout")]`, so a fresh clone lists them as ignored instead of passing them silently, and
//! CI (which has the folder) runs them. Adding the folder later: `touch build.rs` to re-detect.
//!
//! One script for every package whose tests use the folder (`build = "../../build.rs"` in the
//! crates): it finds the checkout's root as the nearest directory with a `Cargo.lock`.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(memsnap_shared)");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Some(root) = manifest.ancestors().find(|d| d.join("Cargo.lock").is_file()) else { return };
    println!("cargo::rerun-if-changed={}", root.join("build.rs").display());
    let dev = root.join("../shared/snapshots/dev");
    if dev.is_dir() {
        println!("cargo::rerun-if-changed={}", dev.display());
        println!("cargo::rustc-cfg=memsnap_shared");
    }
}
