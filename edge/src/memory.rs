//! Keeping the resident size of edgecore near what it really holds (glibc's allocator only).
//!
//! glibc gives every thread that allocates its own arena (up to 8 per core), and memory freed in
//! one arena is not reused by another: on a gateway with a start-up peak (parsed manifests,
//! database rows) this doubled the resident size. edgecore is IO-bound, so one arena costs it
//! nothing measurable.
#![allow(unsafe_code)]

/// Makes every thread share one malloc arena. Call first in `main`, before any thread starts.
pub fn single_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a glibc allocator parameter; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// How often edgecore hands freed memory back (see [`release_freed`]).
pub const RELEASE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Hands memory freed in the middle of the heap back to the system (glibc returns only the top
/// of the heap by itself). Cheap: it walks the allocator's free lists.
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
