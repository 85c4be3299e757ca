//! Keeping the resident size of a server near what it really holds (glibc's allocator only).
//!
//! glibc gives every thread that allocates its own arena (up to 8 per core), and memory freed in
//! one arena is not reused by another: on a gateway with a start-up peak (parsed manifests,
//! database rows) this doubled the resident size. The project's servers are IO-bound, so one
//! arena costs them nothing measurable. glibc also returns only the top of the heap by itself:
//! [`release_freed`] hands back what was freed in the middle.
//!
//! The only unsafe code of the project: two calls into glibc.
#![allow(unsafe_code)]

/// Makes every thread share one malloc arena. Call first in `main`, before any thread starts.
pub fn single_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a glibc allocator parameter; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Hands memory freed in the middle of the heap back to the system. Cheap: it walks the
/// allocator's free lists.
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Calls [`release_freed`] every `every` on a thread of its own, for the life of the process.
pub fn release_freed_every(every: std::time::Duration) {
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(every);
            release_freed();
        }
    });
}
