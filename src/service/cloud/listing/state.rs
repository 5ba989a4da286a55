//! The plain core of the instance listings readers are served from.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::CloudInstance;

/// What a reader gets now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Read {
    /// The last listing, this old.
    Fresh(Arc<Vec<CloudInstance>>, Duration),
    /// None is fresh enough: wait for the next; `list` says whether to make it now (none is in
    /// flight).
    Wait {
        /// Make the listing now.
        list: bool,
    },
}

/// The last listing, and whether one is in flight.
#[derive(Debug, Default)]
pub(crate) struct ListingBook {
    last: Option<(Arc<Vec<CloudInstance>>, Instant)>,
    in_flight: bool,
    /// When the cloud last changed through this service: a listing begun before is outdated.
    changed_at: Option<Instant>,
}

impl ListingBook {
    /// A reader asks at `now` for a listing at most `max_age` old.
    pub(crate) fn read(&mut self, now: Instant, max_age: Duration) -> Read {
        if let Some((list, at)) = &self.last {
            let age = now.saturating_duration_since(*at);
            if age <= max_age {
                return Read::Fresh(list.clone(), age);
            }
        }
        let list = !self.in_flight;
        self.in_flight = true;
        Read::Wait { list }
    }

    /// A listing begun at `at` (ours, or the provisioner's own): kept if newer than the last
    /// and begun after the last change. Whether it was (else it may miss that change).
    pub(crate) fn listed(&mut self, list: Arc<Vec<CloudInstance>>, at: Instant) -> bool {
        if self.changed_at.is_some_and(|c| at < c) {
            return false;
        }
        if self.last.as_ref().is_none_or(|(_, last)| *last <= at) {
            self.last = Some((list, at));
        }
        true
    }

    /// The cloud changed (an instance started, stopped or released through this service): the
    /// last listing no longer answers readers (a listing already in flight may still be older
    /// than the change: it answers its waiters, and the next read makes another).
    pub(crate) fn changed(&mut self, now: Instant) {
        self.last = None;
        self.changed_at = Some(now);
    }

    /// Our listing ended (answered or failed): the next stale read makes another.
    pub(crate) fn ended(&mut self) {
        self.in_flight = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_are_served_from_one_listing_while_it_is_fresh() {
        let t0 = Instant::now();
        let mut b = ListingBook::default();
        assert_eq!(b.read(t0, Duration::from_secs(5)), Read::Wait { list: true });
        // Others asking meanwhile wait for the same listing.
        for _ in 0..300 {
            assert_eq!(b.read(t0, Duration::from_secs(5)), Read::Wait { list: false });
        }
        let list = Arc::new(Vec::new());
        b.listed(list.clone(), t0 + Duration::from_millis(100));
        b.ended();
        assert_eq!(
            b.read(t0 + Duration::from_secs(3), Duration::from_secs(5)),
            Read::Fresh(list.clone(), Duration::from_millis(2_900))
        );
        // Stale: one more listing.
        assert_eq!(b.read(t0 + Duration::from_secs(6), Duration::from_secs(5)), Read::Wait { list: true });
        // An older listing arriving late does not replace a newer one.
        let newer = Arc::new(Vec::new());
        b.listed(newer.clone(), t0 + Duration::from_secs(6));
        b.listed(Arc::new(Vec::new()), t0 + Duration::from_secs(4));
        b.ended();
        assert!(
            matches!(b.read(t0 + Duration::from_secs(6), Duration::from_secs(5)), Read::Fresh(l, _) if Arc::ptr_eq(&l, &newer))
        );
        // A change through this service: the next read lists again, and a listing begun before
        // the change (the provisioner's, or one in flight) is not kept.
        b.changed(t0 + Duration::from_secs(7));
        assert!(!b.listed(Arc::new(Vec::new()), t0 + Duration::from_millis(6_500)));
        assert_eq!(b.read(t0 + Duration::from_secs(7), Duration::from_secs(5)), Read::Wait { list: true });
        assert!(b.listed(newer.clone(), t0 + Duration::from_secs(7)));
        b.ended();
        assert!(matches!(b.read(t0 + Duration::from_secs(8), Duration::from_secs(5)), Read::Fresh(..)));
    }
}
