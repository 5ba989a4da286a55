//! The event stream (`GET /v1/events`, server-sent events): every provisioner event as one
//! `data:` line of JSON, to every connected client.
//!
//! [`event_view`] and [`sse_frame`] are the plain core; [`EventHub`] the actor that keeps the
//! connected streams (one channel each), fans events out, drops streams whose client went
//! away (a comment line every 15 s finds them), and closes them all at shutdown so that the
//! HTTP server can stop without waiting for streams that never end.
//!
//! Each client's queue is bounded ([`QUEUE_LIMIT`] frames not yet taken by its connection): a
//! client that stops reading is dropped once its queue is full, or once frames have waited for
//! it and none could be written for `[events] idle_timeout` (60 s), with a last
//! `stream-dropped` event telling it to reconnect, so that it costs at most that many frames of
//! memory.
//!
//! [`StreamGate`] is the replica's one gate of every model's streams: it admits a stream only
//! within the caps (`[events] max_streams_per_token`, `max_streams`; beyond them the API
//! answers 429), and ends the streams of a revoked token with a last `token-revoked` event: at
//! once for a revocation made through this replica, and within [`REVOCATION_CHECK`] for one
//! made through another (it re-reads the tokens holding streams that often). The decisions are
//! the plain core's (`state.rs`).
//!
//! - `view`: [`EventView`] and the frames (plain).
//! - `hub`: [`EventHub`], a model's streams.
//! - `gate`: [`StreamGate`], the replica's caps and revocations over every model's streams.
//! - `state`: the gate's plain core ([`StreamBook`], [`IdleWatch`]).

mod gate;
mod hub;
mod state;
#[cfg(test)]
mod tests;
mod view;

pub(crate) use gate::{Admit, Revoked, StreamGate};
pub(crate) use hub::{CloseStreams, EventHub, OpenStream};
pub(crate) use view::EventView;
#[cfg(feature = "postgres")]
pub(crate) use view::RoleChanged;
