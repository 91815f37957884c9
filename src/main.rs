//! `memsnap`: the command-line binary. The commands are the library's (`src/lib.rs`); the binary
//! adds only the global allocator, which turns a failed allocation into an error line
//! (`alloc.rs`). It stays here: the Python extension shares the library, and an extension
//! loaded into Python must not install a global allocator.

mod alloc;

#[global_allocator]
static ALLOCATOR: alloc::ExitOnFailure = alloc::ExitOnFailure;

fn main() -> std::process::ExitCode {
    memsnap::main_with(std::env::args_os())
}
