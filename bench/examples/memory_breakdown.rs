//! Where the memory per empty file goes: creates N empty files (1000 per directory, 16-byte
//! names, as `lanefs bench memory`) under a counting allocator and prints the bytes requested
//! per file by allocation size, next to the growth of resident memory.
//!
//! ```sh
//! cargo run --release -p lanefs-bench --example memory_breakdown -- 1000000
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use lanefs_bench::adapter::Engine;
use lanefs_bench::{create_empty_files, rss_bytes};

/// Size bands: 8-byte steps up to 256 bytes, then powers of two.
const BANDS: usize = 33 + 64;

static COUNT: [AtomicI64; BANDS] = [const { AtomicI64::new(0) }; BANDS];
static BYTES: [AtomicI64; BANDS] = [const { AtomicI64::new(0) }; BANDS];

fn band(size: usize) -> usize {
    if size <= 256 {
        size.div_ceil(8)
    } else {
        33 + size.next_power_of_two().trailing_zeros() as usize
    }
}

fn band_name(b: usize) -> String {
    if b <= 32 {
        format!("{} B", b * 8)
    } else {
        let hi = 1u64 << (b - 33);
        format!("{}..{} B", hi / 2 + 1, hi)
    }
}

struct Counting;

// SAFETY: forwards to the system allocator unchanged; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let b = band(l.size());
        COUNT[b].fetch_add(1, Relaxed);
        BYTES[b].fetch_add(l.size() as i64, Relaxed);
        // SAFETY: the caller's layout contract is passed on as is.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let b = band(l.size());
        COUNT[b].fetch_sub(1, Relaxed);
        BYTES[b].fetch_sub(l.size() as i64, Relaxed);
        // SAFETY: `p` came from `alloc` above with this layout.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn main() {
    let files: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("a number of files"))
        .unwrap_or(1_000_000);
    let e = Engine::new(lanefs::Locking::Lanes, 0);
    let snap: Vec<(i64, i64)> = (0..BANDS)
        .map(|b| (COUNT[b].load(Relaxed), BYTES[b].load(Relaxed)))
        .collect();
    let before = rss_bytes();
    create_empty_files(&e, files);
    let grown = rss_bytes().saturating_sub(before);
    let per = |x: i64| x as f64 / files as f64;
    let mut total = 0;
    println!("{files} empty files; bytes requested per file, by allocation size:");
    for b in 0..BANDS {
        let (c, n) = (
            COUNT[b].load(Relaxed) - snap[b].0,
            BYTES[b].load(Relaxed) - snap[b].1,
        );
        total += n;
        if per(n).abs() >= 0.5 {
            println!(
                "  {:>22}: {:>9} live, {:6.1} B/file",
                band_name(b),
                c,
                per(n)
            );
        }
    }
    println!("  {:>22}: {:6.1} B/file", "total requested", per(total));
    println!(
        "  {:>22}: {:6.1} B/file (system allocator)",
        "resident growth",
        grown as f64 / files as f64
    );
}
