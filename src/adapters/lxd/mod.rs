//! The LXD broker (feature `lxd`): the [`Broker`](crate::ports::Broker) port over LXD's REST
//! API, on its unix socket or over HTTPS.
