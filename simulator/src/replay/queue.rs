//! The replay's event queue: events in time order, ties broken by class, then by the order
//! they were scheduled.
//!
//! Most events go into a heap. Events that are always scheduled a fixed delay after "now"
//! (Envoy's stream idle timeout) go into a FIFO instead: the clock never goes back, so the FIFO
//! is already in order. That matters because there is one such event for every paused request,
//! each 300 s ahead: a dense trace has hundreds of thousands in flight, which in a heap would
//! make every push and pop of every other event slower.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

/// Where an event falls in the order: time, class, then scheduling order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Position {
    at_ns: u64,
    class: u8,
    seq: u64,
}

struct Entry<E> {
    position: Position,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.position == other.position
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    /// Reversed: [`BinaryHeap`] pops its greatest, and the queue wants the earliest.
    fn cmp(&self, other: &Self) -> Ordering {
        other.position.cmp(&self.position)
    }
}

/// Events in the order they are to run.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    fifo: VecDeque<Entry<E>>,
    seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            fifo: VecDeque::new(),
            seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    fn position(&mut self, at_ns: u64, class: u8) -> Position {
        self.seq += 1;
        Position {
            at_ns,
            class,
            seq: self.seq,
        }
    }

    /// Schedules `event` at `at_ns`; among events of one instant, lower classes run first.
    pub fn push(&mut self, at_ns: u64, class: u8, event: E) {
        let position = self.position(at_ns, class);
        self.heap.push(Entry { position, event });
    }

    /// Schedules `event` at `at_ns`, which is no earlier than any other event scheduled this
    /// way, and of the same class (a fixed delay after a clock that never goes back).
    pub fn push_in_order(&mut self, at_ns: u64, class: u8, event: E) {
        let position = self.position(at_ns, class);
        debug_assert!(
            self.fifo
                .back()
                .is_none_or(|last| (last.position.at_ns, last.position.class) <= (at_ns, class)),
            "push_in_order out of order"
        );
        self.fifo.push_back(Entry { position, event });
    }

    fn fifo_first(&self) -> bool {
        match (self.heap.peek(), self.fifo.front()) {
            (Some(h), Some(f)) => f.position < h.position,
            (None, Some(_)) => true,
            _ => false,
        }
    }

    /// The next event and its time, without taking it.
    pub fn peek(&self) -> Option<(u64, &E)> {
        let entry = if self.fifo_first() {
            self.fifo.front()
        } else {
            self.heap.peek()
        }?;
        Some((entry.position.at_ns, &entry.event))
    }

    /// Takes the next event and its time.
    pub fn pop(&mut self) -> Option<(u64, E)> {
        let entry = if self.fifo_first() {
            self.fifo.pop_front()
        } else {
            self.heap.pop()
        }?;
        Some((entry.position.at_ns, entry.event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(queue: &mut EventQueue<&'static str>) -> Vec<(u64, &'static str)> {
        std::iter::from_fn(|| queue.pop()).collect()
    }

    #[test]
    fn events_come_out_by_time_then_class_then_scheduling_order() {
        let mut queue = EventQueue::default();
        queue.push(20, 1, "late");
        queue.push(10, 1, "answer");
        queue.push(10, 0, "arrival");
        queue.push(10, 1, "second answer");
        assert_eq!(
            drain(&mut queue),
            [
                (10, "arrival"),
                (10, "answer"),
                (10, "second answer"),
                (20, "late")
            ]
        );
    }

    #[test]
    fn in_order_events_interleave_with_the_heap_as_if_they_were_in_it() {
        let mut queue = EventQueue::default();
        queue.push_in_order(10, 1, "timeout a");
        queue.push(10, 1, "answer");
        queue.push(5, 0, "arrival");
        queue.push_in_order(10, 1, "timeout b");
        queue.push(10, 0, "arrival at 10");
        queue.push_in_order(30, 1, "timeout c");
        queue.push(20, 1, "tick");
        assert_eq!(queue.peek(), Some((5, &"arrival")));
        assert_eq!(
            drain(&mut queue),
            [
                (5, "arrival"),
                (10, "arrival at 10"),
                (10, "timeout a"),
                (10, "answer"),
                (10, "timeout b"),
                (20, "tick"),
                (30, "timeout c"),
            ]
        );
        assert_eq!(queue.peek(), None);
    }
}
