//! The leader lease's plain core: [`LeaseBook`] decides, from the time, the last successful
//! renewal and the database's answers, what a replica does next (try to acquire, renew, step
//! down, release), and says each change of role as a [`Transition`]. No actix, no SQL: the
//! shell (`actor.rs`) carries out the [`Step`]s on the database and feeds the answers back.
//!
//! The safety rule: a leader stops acting once `renew_deadline` has passed since the *sending*
//! of its last renewal that succeeded. The database set that renewal's expiry to its own
//! `now() + lease`, no earlier than the sending, so the replica stops at least
//! `lease - renew_deadline` before anyone else can take the lease (clocks that run at the same
//! rate assumed; fencing covers the rest).
// Without PostgreSQL there are no replicas: only the types the status shows are used.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use std::time::Duration;

use tokio::time::Instant;

use crate::service::settings::LeaseTimings;

/// This replica's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Serves the API; runs no provisioner actors.
    Follower,
    /// Holds the lease at `epoch`: runs the actors, its writes are fenced with the epoch.
    Leader {
        /// The lease's epoch.
        epoch: i64,
    },
}

impl Role {
    /// `leader` or `follower` (the status' `role`).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Role::Follower => "follower",
            Role::Leader { .. } => "leader",
        }
    }
}

/// What the shell does now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Try to take the lease (it is taken only if free or expired).
    Acquire,
    /// Renew the lease held at `epoch`.
    Renew {
        /// The epoch held.
        epoch: i64,
    },
    /// Release the lease held at `epoch` (its expiry set to now, the epoch kept).
    Release {
        /// The epoch held.
        epoch: i64,
    },
    /// Nothing until the next tick (an attempt is in flight, or the book is shut down).
    Wait,
}

/// The database's answer to a [`Step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The lease was taken, at this epoch.
    Acquired {
        /// The new epoch.
        epoch: i64,
    },
    /// The lease is someone else's (not expired): `holder` at `epoch`, where known.
    HeldBy {
        /// The holder's replica id.
        holder: String,
        /// Its epoch.
        epoch: i64,
    },
    /// The renewal succeeded.
    Renewed,
    /// The renewal was refused: the lease is no longer ours at our epoch.
    Refused,
    /// The lease was released.
    Released,
    /// The database could not be asked (unreachable, timed out): nothing is known.
    Failed(String),
}

/// Why a replica changed role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// It took a free or expired lease.
    Acquired,
    /// Its renewal was refused (someone else holds the lease now).
    Refused,
    /// `renew_deadline` passed without a successful renewal.
    DeadlinePassed,
    /// It released the lease (clean shutdown).
    Released,
    /// It handed the model over (the spread of leaders over replicas: this replica was above
    /// its fair share); the lease was released for another replica to take at once.
    HandedOver,
    /// Its own work made no progress for `renew_deadline` (its store or provisioner did not
    /// answer a probe): it stepped down and released the lease, so that a replica that can
    /// work takes over, and asks again only once a probe answers.
    Stalled,
}

impl Why {
    /// A short word for logs, events and the status.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Why::Acquired => "acquired",
            Why::Refused => "refused",
            Why::DeadlinePassed => "renew_deadline",
            Why::Released => "released",
            Why::HandedOver => "handed_over",
            Why::Stalled => "stalled",
        }
    }
}

/// A change of role, to carry out at once: to leader ⇒ set the fence and start the actors; to
/// follower ⇒ stop the actors (in-flight cloud calls abandoned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    /// The role before.
    pub from: Role,
    /// The role after.
    pub to: Role,
    /// Why.
    pub why: Why,
    /// When.
    pub at: Instant,
}

/// The lease's core for one model.
#[derive(Debug, Clone)]
pub(crate) struct LeaseBook {
    timings: LeaseTimings,
    role: Role,
    /// When the last successful acquire or renewal was sent (a leader's only).
    renewed_sent_at: Option<Instant>,
    /// An attempt is in flight, sent at this time.
    in_flight: Option<Instant>,
    /// The last holder seen (ours when leader).
    holder: Option<(String, i64)>,
    /// Shut down: no more acquiring.
    shut_down: bool,
    /// A lease acquired after shutdown, to release at the next tick.
    release_due: Option<i64>,
    /// Whether a follower tries to acquire (the spread of leaders: only the models its replica
    /// is given; always, when leaders are not spread).
    may_acquire: bool,
    /// A hand-over asked for while an attempt was in flight: carried out at the next tick.
    hand_over_due: bool,
    /// When this replica's own work last proved it makes progress (a probe answered; as a
    /// leader's first probe goes, the time it went): a leader whose last proof is older than
    /// `renew_deadline` steps down ([`Why::Stalled`]).
    progress_at: Option<Instant>,
    /// A probe in flight, sent at this time.
    probe_sent: Option<Instant>,
    /// Stepped down for want of progress: no acquiring until a probe answers.
    stalled: bool,
    transitions: u64,
    last: Option<Transition>,
    /// The replica's beat, if its leases tick together (issue 36): each tick falls on
    /// `beat + k × retry`, the same instants for every model of the replica, so that their
    /// renewals reach the lease thread together and commit in a few statements, not in one
    /// round each.
    beat: Option<Instant>,
}

impl LeaseBook {
    /// A follower that has not asked yet.
    pub(crate) fn new(timings: LeaseTimings) -> Self {
        Self {
            timings,
            role: Role::Follower,
            renewed_sent_at: None,
            in_flight: None,
            holder: None,
            shut_down: false,
            release_due: None,
            may_acquire: true,
            hand_over_due: false,
            progress_at: None,
            probe_sent: None,
            stalled: false,
            transitions: 0,
            last: None,
            beat: None,
        }
    }

    /// The same book, its ticks on the replica's beat from `origin` (see `beat`).
    pub(crate) fn with_beat(self, origin: Instant) -> Self {
        Self { beat: Some(origin), ..self }
    }

    /// A follower that tries to acquire only once allowed ([`LeaseBook::allow`]): the spread
    /// of leaders over replicas decides which models a replica asks for.
    pub(crate) fn spread(timings: LeaseTimings) -> Self {
        Self { may_acquire: false, ..Self::new(timings) }
    }

    /// Whether a follower tries to acquire from now on (a leader renews whatever this says).
    pub(crate) fn allow(&mut self, may_acquire: bool) {
        self.may_acquire = may_acquire;
    }

    /// Whether a follower tries to acquire.
    pub(crate) fn may_acquire(&self) -> bool {
        self.may_acquire
    }

    /// What the spread's driver read of the lease (a follower that does not ask learns the
    /// holder this way): `Some((holder, epoch))` while held, unexpired; `None` while free.
    /// A leader's own view is left alone.
    pub(crate) fn observe(&mut self, holder: Option<(String, i64)>) {
        if matches!(self.role, Role::Follower) && self.in_flight.is_none() {
            self.holder = holder;
        }
    }

    /// A controlled hand-over: a leader stops acting at once (a transition to follower, as a
    /// fail-over would: the shell stops its provisioner) and releases the lease, keeping the
    /// epoch, so that another replica takes it at once at `epoch + 1`. With an attempt in
    /// flight it is done at the next tick. A follower has nothing to hand over.
    pub(crate) fn hand_over(&mut self, now: Instant) -> (Option<Transition>, Step) {
        if !matches!(self.role, Role::Leader { .. }) || self.shut_down {
            return (None, Step::Wait);
        }
        self.hand_over_due = true;
        // Not taken back by this replica until the spread gives it back.
        self.may_acquire = false;
        if self.in_flight.is_some() {
            return (None, Step::Wait);
        }
        self.tick(now)
    }

    /// The timings.
    #[cfg(test)]
    pub(crate) fn timings(&self) -> LeaseTimings {
        self.timings
    }

    /// The role now.
    pub(crate) fn role(&self) -> Role {
        self.role
    }

    /// The last holder seen and its epoch (this replica's when leader).
    pub(crate) fn holder(&self) -> Option<(&str, i64)> {
        self.holder.as_ref().map(|(h, e)| (h.as_str(), *e))
    }

    /// How many transitions so far.
    pub(crate) fn transitions(&self) -> u64 {
        self.transitions
    }

    /// The last transition.
    pub(crate) fn last_transition(&self) -> Option<Transition> {
        self.last
    }

    /// Whether the replica may act as leader at `now`: a leader whose renew deadline has not
    /// passed. (The shell asks before each step too, so that a late timer never lets it act.)
    pub(crate) fn may_act(&self, now: Instant) -> bool {
        matches!(self.role, Role::Leader { .. })
            && self.renewed_sent_at.is_some_and(|t| now.saturating_duration_since(t) < self.timings.renew_deadline())
    }

    /// The time at which a leader must stop acting, if it is one: its renew deadline, or the
    /// time its last proof of progress grows older than the renew deadline.
    pub(crate) fn acting_deadline(&self) -> Option<Instant> {
        match self.role {
            Role::Leader { .. } => {
                let renewal = self.renewed_sent_at.map(|t| t + self.timings.renew_deadline());
                let progress = self.progress_at.map(|t| t + self.timings.renew_deadline());
                match (renewal, progress) {
                    (Some(r), Some(p)) => Some(r.min(p)),
                    (r, p) => r.or(p),
                }
            }
            Role::Follower => None,
        }
    }

    /// Whether the shell should probe this replica's own work now (its store answers a read,
    /// its provisioner answers a question): a leader proves its progress so, and a replica that
    /// stepped down for want of it proves it is well again. One probe in flight at a time.
    pub(crate) fn probe_due(&mut self, now: Instant) -> bool {
        let wanted = matches!(self.role, Role::Leader { .. }) || self.stalled;
        if !wanted || self.probe_sent.is_some() {
            return false;
        }
        self.probe_sent = Some(now);
        if matches!(self.role, Role::Leader { .. }) {
            self.progress_at.get_or_insert(now);
        }
        true
    }

    /// The probe sent last answered at `now`: `ok` if the work answered well.
    pub(crate) fn probed(&mut self, now: Instant, ok: bool) {
        self.probe_sent = None;
        if ok {
            self.progress_at = Some(now);
            self.stalled = false;
        }
    }

    /// Whether this replica stepped down for want of progress and has not proved it since.
    #[cfg(test)]
    pub(crate) fn stalled(&self) -> bool {
        self.stalled
    }

    /// Whether a leader's last proof of progress is older than the renew deadline at `now`.
    fn no_progress(&self, now: Instant) -> bool {
        matches!(self.role, Role::Leader { .. })
            && self.progress_at.is_some_and(|t| now.saturating_duration_since(t) >= self.timings.renew_deadline())
    }

    /// When the shell calls [`LeaseBook::tick`] next: after one retry (at the replica's next
    /// beat, if it has one: within one retry), or at the acting deadline if that comes first.
    pub(crate) fn next_tick(&self, now: Instant) -> Instant {
        let period = self.timings.retry();
        let retry = match self.beat.filter(|origin| now >= *origin && !period.is_zero()) {
            Some(origin) => {
                let beats = (now - origin).as_nanos() / period.as_nanos() + 1;
                origin + Duration::from_nanos(u64::try_from(beats * period.as_nanos()).unwrap_or(u64::MAX))
            }
            None => now + period,
        };
        self.acting_deadline().map_or(retry, |d| d.min(retry).max(now))
    }

    /// The clock ticked: steps down a leader past its deadline, then says what to ask.
    pub(crate) fn tick(&mut self, now: Instant) -> (Option<Transition>, Step) {
        let mut transition = None;
        if let Role::Leader { epoch } = self.role {
            if self.no_progress(now) {
                // Its lease is healthy but its work is not: another replica takes over at once.
                let t = self.become_follower(Why::Stalled, now);
                self.stalled = true;
                if self.in_flight.is_some() || self.shut_down {
                    // A renewal in flight: the lease expires on its own.
                    return (Some(t), Step::Wait);
                }
                self.in_flight = Some(now);
                return (Some(t), Step::Release { epoch });
            }
        }
        if matches!(self.role, Role::Leader { .. }) && !self.may_act(now) {
            transition = Some(self.become_follower(Why::DeadlinePassed, now));
        }
        if self.in_flight.is_some() {
            return (transition, Step::Wait);
        }
        if std::mem::take(&mut self.hand_over_due) {
            if let Role::Leader { epoch } = self.role {
                let t = self.become_follower(Why::HandedOver, now);
                self.in_flight = Some(now);
                return (Some(t), Step::Release { epoch });
            }
        }
        if self.shut_down {
            return match self.release_due.take() {
                Some(epoch) => {
                    self.in_flight = Some(now);
                    (transition, Step::Release { epoch })
                }
                None => (transition, Step::Wait),
            };
        }
        let step = match self.role {
            Role::Leader { epoch } => Step::Renew { epoch },
            Role::Follower if self.may_acquire && !self.stalled => Step::Acquire,
            Role::Follower => return (transition, Step::Wait),
        };
        self.in_flight = Some(now);
        (transition, step)
    }

    /// The answer to the step sent last (`id` is this replica's id).
    pub(crate) fn answer(&mut self, id: &str, now: Instant, answer: Answer) -> Option<Transition> {
        let sent_at = self.in_flight.take().unwrap_or(now);
        match (answer, self.role) {
            (Answer::Acquired { epoch }, Role::Follower) if self.shut_down => {
                // Taken while shutting down: never acted on, released at the next tick.
                self.release_due = Some(epoch);
                None
            }
            (Answer::Acquired { epoch }, Role::Follower) => {
                self.holder = Some((id.to_owned(), epoch));
                // An answer that arrives after the deadline is no lease to act on: it expires
                // on its own, and the next attempt is refused until then.
                if now.saturating_duration_since(sent_at) >= self.timings.renew_deadline() {
                    return None;
                }
                self.renewed_sent_at = Some(sent_at);
                // Its work is given a whole renew deadline from its first probe to prove its
                // progress (a book that is never probed never stalls).
                self.progress_at = None;
                Some(self.transition(Role::Leader { epoch }, Why::Acquired, now))
            }
            (Answer::Renewed, Role::Leader { .. }) => {
                if self.may_act(now) {
                    self.renewed_sent_at = Some(sent_at);
                    None
                } else {
                    // Too late: the deadline passed while the renewal was in flight.
                    Some(self.become_follower(Why::DeadlinePassed, now))
                }
            }
            (Answer::Refused, Role::Leader { .. }) => Some(self.become_follower(Why::Refused, now)),
            (Answer::HeldBy { holder, epoch }, _) => {
                self.holder = Some((holder, epoch));
                match self.role {
                    Role::Leader { .. } => Some(self.become_follower(Why::Refused, now)),
                    Role::Follower => None,
                }
            }
            (Answer::Released, Role::Leader { .. }) => Some(self.become_follower(Why::Released, now)),
            (Answer::Failed(_), Role::Leader { .. }) if !self.may_act(now) => {
                Some(self.become_follower(Why::DeadlinePassed, now))
            }
            _ => None,
        }
    }

    /// Clean shutdown: a leader releases its lease (and stops acting at once); a follower
    /// stops asking. Returns the step to carry out.
    pub(crate) fn shutdown(&mut self, now: Instant) -> (Option<Transition>, Step) {
        self.shut_down = true;
        match self.role {
            Role::Leader { epoch } => {
                let t = self.become_follower(Why::Released, now);
                self.in_flight = Some(now);
                (Some(t), Step::Release { epoch })
            }
            Role::Follower => (None, Step::Wait),
        }
    }

    fn become_follower(&mut self, why: Why, now: Instant) -> Transition {
        self.renewed_sent_at = None;
        self.transition(Role::Follower, why, now)
    }

    fn transition(&mut self, to: Role, why: Why, at: Instant) -> Transition {
        let t = Transition { from: self.role, to, why, at };
        self.role = to;
        self.transitions += 1;
        self.last = Some(t);
        t
    }
}

/// The role as `/v1/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseStatus {
    /// `leader` or `follower`.
    pub role: &'static str,
    /// The holder last seen (this replica's id when leader).
    pub leader: Option<String>,
    /// The holder's epoch.
    pub epoch: Option<i64>,
    /// This replica's id.
    pub replica: String,
    /// The last transition: from, to, why, and how long ago.
    pub last_transition: Option<(&'static str, &'static str, &'static str, Duration)>,
    /// Transitions so far.
    pub transitions: u64,
}
