//! The module's allocator: freed small blocks are kept by size class and handed out again,
//! in front of Rust's dlmalloc.
//!
//! A request allocates a few dozen small blocks (keys, the callout's body, the host's copies
//! of header values, the answer's verdicts) and frees them all by the time it ends. Each went
//! through dlmalloc's bins and boundary tags, about 300 instructions an allocation and its free
//! in wasm; a free list per size class makes that a handful. Blocks stay in their class once
//! made (at most [`KEPT_PER_CLASS`] free ones each, the rest go back to dlmalloc), so the
//! memory kept is bounded.
//!
//! The module runs single-threaded (wasm32 without atomics): the lists need no lock. Every
//! block the host hands the module comes from `proxy_on_memory_allocate` (the module exports
//! no `malloc`), so every block freed here was allocated here, with the size it is freed with.

#![allow(unsafe_code)]
// The module installs it as its allocator on wasm alone; on the host only the tests use it.
#![cfg_attr(not(any(target_family = "wasm", test)), allow(dead_code))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;

/// Size classes are multiples of this; it is also the largest alignment they serve.
const GRAIN: usize = 16;
/// Blocks up to this size are kept; larger ones go straight to dlmalloc.
const LARGEST: usize = 256;
const CLASSES: usize = LARGEST / GRAIN;
/// Free blocks kept per class.
const KEPT_PER_CLASS: u32 = 256;

/// A free block: the next free block of its class.
struct FreeBlock {
    next: *mut FreeBlock,
}

struct Lists {
    heads: [*mut FreeBlock; CLASSES],
    kept: [u32; CLASSES],
}

/// Free lists in front of [`System`] (dlmalloc on wasm32-wasip1).
pub struct ClassCache {
    lists: UnsafeCell<Lists>,
}

// SAFETY: the module is single-threaded; nothing else reaches the lists.
unsafe impl Sync for ClassCache {}

impl ClassCache {
    /// Empty lists.
    pub const fn new() -> ClassCache {
        ClassCache {
            lists: UnsafeCell::new(Lists {
                heads: [ptr::null_mut(); CLASSES],
                kept: [0; CLASSES],
            }),
        }
    }
}

impl Default for ClassCache {
    fn default() -> ClassCache {
        ClassCache::new()
    }
}

/// The class of a layout the lists serve, and the layout its blocks are made with.
fn class(layout: Layout) -> Option<(usize, Layout)> {
    if layout.size() == 0 || layout.size() > LARGEST || layout.align() > GRAIN {
        return None;
    }
    let index = (layout.size() - 1) / GRAIN;
    let block = Layout::from_size_align((index + 1) * GRAIN, GRAIN).ok()?;
    Some((index, block))
}

// SAFETY: every block handed out is either fresh from `System` with the class's layout (which
// is at least as large and as aligned as asked), or such a block freed earlier; a block goes
// back to `System` with the layout it was made with.
unsafe impl GlobalAlloc for ClassCache {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some((index, block)) = class(layout) else {
            return unsafe { System.alloc(layout) };
        };
        let lists = unsafe { &mut *self.lists.get() };
        let head = lists.heads[index];
        if head.is_null() {
            return unsafe { System.alloc(block) };
        }
        lists.heads[index] = unsafe { (*head).next };
        lists.kept[index] -= 1;
        head.cast()
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some((index, block)) = class(layout) else {
            return unsafe { System.dealloc(ptr, layout) };
        };
        let lists = unsafe { &mut *self.lists.get() };
        if lists.kept[index] >= KEPT_PER_CLASS {
            return unsafe { System.dealloc(ptr, block) };
        }
        let free = ptr.cast::<FreeBlock>();
        unsafe {
            free.write(FreeBlock {
                next: lists.heads[index],
            })
        };
        lists.heads[index] = free;
        lists.kept[index] += 1;
    }

    // Rare (a growing Vec or String): one copy, not one inlined into every call site.
    #[inline(never)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return ptr::null_mut();
        };
        match (class(layout), class(new_layout)) {
            // Neither is kept here: dlmalloc may grow in place.
            (None, None) => unsafe { System.realloc(ptr, layout, new_size) },
            // Still fits the block it has.
            (Some((old, _)), Some((new, _))) if old == new => ptr,
            _ => {
                let moved = unsafe { self.alloc(new_layout) };
                if !moved.is_null() {
                    let kept = layout.size().min(new_size);
                    unsafe { ptr::copy_nonoverlapping(ptr, moved, kept) };
                    unsafe { self.dealloc(ptr, layout) };
                }
                moved
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn a_freed_block_is_handed_out_again_for_any_size_of_its_class() {
        let cache = ClassCache::new();
        unsafe {
            let first = cache.alloc(layout(24, 8));
            cache.dealloc(first, layout(24, 8));
            // 17 to 32 bytes share the 32-byte class.
            let again = cache.alloc(layout(17, 1));
            assert_eq!(again, first);
            let other_class = cache.alloc(layout(33, 8));
            assert_ne!(other_class, first);
            cache.dealloc(again, layout(17, 1));
            cache.dealloc(other_class, layout(33, 8));
        }
    }

    #[test]
    fn blocks_are_as_large_and_aligned_as_asked_and_keep_their_bytes_through_realloc() {
        let cache = ClassCache::new();
        for align in [1, 2, 8, 16, 64] {
            for size in [1, 15, 16, 17, 200, 256, 257, 1000] {
                for new_size in [size / 2 + 1, size, size + 1, 3 * size] {
                    unsafe {
                        let p = cache.alloc(layout(size, align));
                        assert_eq!(p as usize % align, 0, "{size} bytes aligned to {align}");
                        for i in 0..size {
                            p.add(i).write(i as u8);
                        }
                        let q = cache.realloc(p, layout(size, align), new_size);
                        assert_eq!(q as usize % align, 0, "{new_size} bytes aligned to {align}");
                        for i in 0..size.min(new_size) {
                            assert_eq!(q.add(i).read(), i as u8, "byte {i}: {size} -> {new_size}");
                        }
                        // The whole new size is usable.
                        q.add(new_size - 1).write(0xAB);
                        cache.dealloc(q, layout(new_size, align));
                    }
                }
            }
        }
    }

    #[test]
    fn no_more_than_the_bound_of_free_blocks_is_kept_per_class() {
        let cache = ClassCache::new();
        let count = KEPT_PER_CLASS as usize + 50;
        unsafe {
            let blocks: Vec<*mut u8> = (0..count).map(|_| cache.alloc(layout(48, 8))).collect();
            for &b in &blocks {
                cache.dealloc(b, layout(48, 8));
            }
            let lists = &*cache.lists.get();
            assert_eq!(lists.kept[2], KEPT_PER_CLASS);
            let mut listed = 0;
            let mut next = lists.heads[2];
            while !next.is_null() {
                listed += 1;
                next = (*next).next;
            }
            assert_eq!(listed, KEPT_PER_CLASS);
            // Empty the lists again so the blocks go back to the system allocator.
            let again: Vec<*mut u8> = (0..count).map(|_| cache.alloc(layout(48, 8))).collect();
            assert_eq!((*cache.lists.get()).kept[2], 0);
            for b in again {
                System.dealloc(b, layout(48, 16));
            }
        }
    }
}
