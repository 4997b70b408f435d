//! # lanefs-client: the preloaded client of `lanefs run`
//!
//! Loaded into a program with `LD_PRELOAD` (`lanefs run -- CMD` sets it; children inherit
//! it), this library takes the program's calls on paths inside a lanefs mount to the
//! mount's server over a shared-memory channel (`lanefs-channel`; the server's side is
//! `fuse/src/channel.rs`), around the kernel's VFS, which locks a directory exclusively
//! around every create, unlink and rename in it before any FUSE server is asked. Through
//! the channel, creates and unlinks of different names in one directory run in parallel,
//! as they do in the library.
//!
//! What it serves, and what it leaves to the kernel (`calls.rs`): the calls that make,
//! remove, rename and inspect names go over the channel. A file created by `open(O_CREAT)`
//! is made over the channel and its descriptor is *deferred* (`fds.rs`): the kernel opens
//! the file only when the program first uses the descriptor for something other than
//! `close` (every C library function that takes a descriptor settles it first,
//! `fdcalls.rs`), so a program that creates a file and closes it never has the kernel look
//! the name up. Every other descriptor is a kernel descriptor: reads, writes, `mmap`, locks,
//! `fork`, `exec` and programs that never call these functions see one filesystem. A change
//! made over the channel invalidates what the kernel cached of it before the call returns
//! (the server's engine reports it).
//!
//! Module map: `calls.rs` (the exported functions on paths), `fdcalls.rs` (those on
//! descriptors), `fds.rs` (deferred descriptors), `paths.rs` (is this path lanefs's?),
//! `mounts.rs` (the mount table), `conn.rs` (a thread's channels and one call), `real.rs`
//! (reaching the C library's own functions without recursion), `warm.rs` (the names whose
//! `stat` the kernel answers from its caches, faster than the channel).
//!
//! Rules this code keeps, because it runs inside other people's programs: no call to a
//! libc name it exports except through `real.rs`; no `std::fs`; errno set only on failure;
//! nothing that can panic on a program's input; a call re-entered from a signal handler goes
//! through the kernel; anything this library cannot decide goes through the kernel.
//!
//! Locks: one, the table of deferred descriptors (`fds.rs`), a leaf: held to defer, to
//! settle (across the kernel's `open` and `dup3`, with signals blocked) and around the
//! program's `close` or `dup2` of a deferred number; never across a channel call, and held
//! across `fork` by the `pthread_atfork` handlers. A thread's channels are its own
//! (thread-local, no lock); the mount table is read without one (`mounts.rs`).

mod calls;
mod conn;
mod fdcalls;
mod fds;
mod mounts;
mod paths;
mod real;
mod warm;

pub use calls::*;
pub use fdcalls::*;

/// Runs when the library is loaded (an ELF constructor), before the program's `main`: the
/// fork handler must be in place before the program can fork, and the settings read from
/// the environment before a signal handler can make the first call.
extern "C" fn on_load() {
    conn::register_fork_handler();
    // Read the environment now: the first call may come from a signal handler that
    // interrupted `malloc`, where reading it (which allocates) is not safe.
    let _ = (fds::on(), warm::on());
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;
