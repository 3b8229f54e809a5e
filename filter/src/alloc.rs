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
