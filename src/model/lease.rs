//! The leader's fence as a plain decision ([`Fence::admits`]): whether a write made on behalf
//! of the provisioner that led at an epoch may commit, given the lease as the database holds it
//! now ([`HeldLease`]). The PostgreSQL store reads the lease's row, share-locked, in the
//! write's own transaction and asks this; the model checker (`sim::mc`) asks the same of its
//! model of the store. No I/O here.

/// The lease as the database holds it when a write checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLease {
    /// The holder's replica id.
    pub holder: String,
    /// The epoch it acquired the lease at.
    pub epoch: i64,
    /// Whether it has not expired (on the database's clock).
    pub live: bool,
}

/// The leader's fence: writes made on behalf of the provisioner commit only while the lease
/// still names this holder at this epoch and has not expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The model whose lease it is.
    pub model_uuid: String,
    /// This replica's holder name.
    pub holder: String,
    /// The epoch it acquired.
    pub epoch: i64,
    /// A mutation (`config::Mutations::skip_fence_check`, tests only): every write is
    /// admitted, the lease unread. Never set outside the model checker's tests.
    pub skip_check: bool,
}

impl Fence {
    /// The fence of `holder` leading `model_uuid` at `epoch`.
    pub fn new(model_uuid: impl Into<String>, holder: impl Into<String>, epoch: i64) -> Self {
        Self { model_uuid: model_uuid.into(), holder: holder.into(), epoch, skip_check: false }
    }

    /// Whether a write under this fence may commit while the lease is `lease` (`None`: no
    /// lease row, never acquired): only while it names this holder at this epoch, unexpired.
    pub fn admits(&self, lease: Option<&HeldLease>) -> bool {
        if self.skip_check {
            return true;
        }
        lease.is_some_and(|l| l.live && l.holder == self.holder && l.epoch == self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holder: &str, epoch: i64, live: bool) -> HeldLease {
        HeldLease { holder: holder.into(), epoch, live }
    }

    #[test]
    fn a_fence_admits_only_its_own_live_lease_at_its_epoch() {
        let f = Fence::new("m", "a", 3);
        assert!(f.admits(Some(&held("a", 3, true))));
        assert!(!f.admits(Some(&held("a", 3, false))), "expired");
        assert!(!f.admits(Some(&held("a", 4, true))), "a newer epoch (a re-acquisition)");
        assert!(!f.admits(Some(&held("b", 3, true))), "another holder");
        assert!(!f.admits(None), "no lease row");
    }

    #[test]
    fn the_mutation_admits_a_stale_write() {
        let f = Fence { skip_check: true, ..Fence::new("m", "a", 3) };
        assert!(f.admits(Some(&held("b", 4, true))));
    }
}
