//! Work in flight, counted by guards that cannot be forgotten, and "tell me when idle".
//!
//! Every piece of one-shot work an actor starts (a follow-up future, a one-shot timer, a call
//! it retries, a state its core reports busy) holds a [`WorkGuard`] from the actor's
//! [`WorkCount`]; dropping the guard (the future ends, the timer fires, the state clears) is
//! what ends the work, so no path can forget to count down. An actor's count answers its
//! `Busy`; the counts of one provisioner's actors share one total, and a waiter registered with
//! [`WorkCount::when_idle`] is answered when that total reaches zero, instead of anyone polling.
//!
//! Plain (no actix): the actors of one provisioner live on one arbiter, so the counts are
//! single-threaded.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use futures::channel::oneshot;

#[derive(Debug, Default)]
struct Total {
    count: usize,
    waiters: Vec<oneshot::Sender<()>>,
}

/// One actor's work in flight, part of its provisioner's total.
#[derive(Debug, Default)]
pub struct WorkCount {
    own: Rc<Cell<usize>>,
    total: Rc<RefCell<Total>>,
}

impl WorkCount {
    /// A count of its own, with a total of its own.
    pub fn new() -> Self {
        Self::default()
    }

    /// A count for another actor of the same provisioner: its own count starts at zero, its
    /// guards count in the same total.
    pub fn sibling(&self) -> Self {
        Self { own: Rc::default(), total: Rc::clone(&self.total) }
    }

    /// A guard for one piece of work: it counts until dropped.
    pub fn guard(&self) -> WorkGuard {
        self.own.set(self.own.get() + 1);
        self.total.borrow_mut().count += 1;
        WorkGuard { own: Rc::clone(&self.own), total: Rc::clone(&self.total) }
    }

    /// This actor's work in flight.
    pub fn count(&self) -> usize {
        self.own.get()
    }

    /// The provisioner's work in flight, every sibling's included.
    #[cfg(test)]
    pub fn total(&self) -> usize {
        self.total.borrow().count
    }

    /// Answers `tx` once the total is zero: now if it is, else when the last guard drops.
    pub fn when_idle(&self, tx: oneshot::Sender<()>) {
        let mut total = self.total.borrow_mut();
        if total.count == 0 {
            let _ = tx.send(());
        } else {
            total.waiters.retain(|w| !w.is_canceled());
            total.waiters.push(tx);
        }
    }
}

/// A core's busy state (notifications waiting, jobs queued, a stale view) as one guard of the
/// provisioner's total, held while the state is busy; set where that state changes. Its guard
/// is not part of the actor's own count (the core reports its busy state itself).
#[derive(Debug)]
pub struct BusyState {
    count: WorkCount,
    guard: Option<WorkGuard>,
}

impl BusyState {
    /// Not busy, counting in `work`'s total.
    pub fn new(work: &WorkCount) -> Self {
        Self { count: work.sibling(), guard: None }
    }

    /// Holds a guard while `busy`, none otherwise.
    pub fn set(&mut self, busy: bool) {
        match (busy, self.guard.is_some()) {
            (true, false) => self.guard = Some(self.count.guard()),
            (false, true) => self.guard = None,
            _ => {}
        }
    }
}

/// One piece of work in flight; dropping it ends the work.
#[derive(Debug)]
#[must_use = "the work ends when the guard is dropped"]
pub struct WorkGuard {
    own: Rc<Cell<usize>>,
    total: Rc<RefCell<Total>>,
}

impl Drop for WorkGuard {
    fn drop(&mut self) {
        self.own.set(self.own.get().saturating_sub(1));
        let waiters = {
            let mut total = self.total.borrow_mut();
            total.count = total.count.saturating_sub(1);
            if total.count == 0 {
                std::mem::take(&mut total.waiters)
            } else {
                Vec::new()
            }
        };
        for w in waiters {
            let _ = w.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(rx: &mut oneshot::Receiver<()>) -> bool {
        matches!(rx.try_recv(), Ok(Some(())))
    }

    #[test]
    fn a_guard_counts_until_dropped() {
        let w = WorkCount::new();
        let g = w.guard();
        let h = w.guard();
        assert_eq!((w.count(), w.total()), (2, 2));
        drop(g);
        assert_eq!(w.count(), 1);
        drop(h);
        assert_eq!((w.count(), w.total()), (0, 0));
    }

    #[test]
    fn siblings_have_their_own_count_and_share_the_total() {
        let a = WorkCount::new();
        let b = a.sibling();
        let g = b.guard();
        assert_eq!((a.count(), b.count(), a.total()), (0, 1, 1));
        drop(g);
        assert_eq!(a.total(), 0);
    }

    #[test]
    fn when_idle_is_answered_at_once_when_nothing_is_in_flight() {
        let w = WorkCount::new();
        let (tx, mut rx) = oneshot::channel();
        w.when_idle(tx);
        assert!(answered(&mut rx));
    }

    #[test]
    fn when_idle_is_answered_when_the_last_guard_of_any_sibling_drops() {
        let a = WorkCount::new();
        let b = a.sibling();
        let ga = a.guard();
        let gb = b.guard();
        let (tx, mut rx) = oneshot::channel();
        b.when_idle(tx);
        drop(gb);
        assert!(!answered(&mut rx), "a sibling still works");
        // Work handed on before the last guard drops keeps the total above zero.
        let handed = b.guard();
        drop(ga);
        assert!(!answered(&mut rx));
        drop(handed);
        assert!(answered(&mut rx));
    }

    #[test]
    fn a_busy_state_holds_one_guard_of_the_total_while_busy() {
        let w = WorkCount::new();
        let mut state = BusyState::new(&w);
        state.set(true);
        state.set(true);
        assert_eq!((w.count(), w.total()), (0, 1), "not the actor's own count, but the total's");
        let (tx, mut rx) = oneshot::channel();
        w.when_idle(tx);
        state.set(false);
        assert_eq!(w.total(), 0);
        assert!(answered(&mut rx));
    }
}
