//! The global allocator: the system's, except that a failed allocation ends the process with
//! a one-line message and exit code 2 instead of Rust's default abort (SIGABRT, "memory
//! allocation of N bytes failed"). The reader's budgets keep real and hostile inputs far from
//! this; it remains for machines with little memory (`ulimit -v`, a cgroup) and inputs that
//! really need more than they have.

use std::alloc::{GlobalAlloc, Layout, System};

pub struct ExitOnFailure;

// SAFETY: every call is forwarded to `System` unchanged; only a null result is acted on, and
// then the process ends without returning.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for ExitOnFailure {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if p.is_null() {
            out_of_memory(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if p.is_null() {
            out_of_memory(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if p.is_null() {
            out_of_memory(new_size);
        }
        p
    }
}

/// Write the message with no allocation (the allocator just failed) and exit with code 2.
fn out_of_memory(size: usize) -> ! {
    let mut msg = [0u8; 160];
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        for &b in bytes {
            if len < msg.len() {
                msg[len] = b;
                len += 1;
            }
        }
    };
    put(b"memsnap: error: out of memory: an allocation of ");
    let mut digits = [0u8; 20];
    let mut n = size;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    put(&digits[i..]);
    put(b" bytes failed (the input needs more memory than this process may use)\n");
    #[allow(unsafe_code)]
    // SAFETY: write(2) on stderr from a valid buffer, then _exit(2), which runs nothing else.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), len);
        libc::_exit(2);
    }
}
