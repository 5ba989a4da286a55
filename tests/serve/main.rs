//! The service, driven as an operator would: the real binary's `serve` on a temporary data
//! directory and a free loopback port, and the client commands against it (the harness is
//! `support`). Includes the crash-safety checks: `kill -9` with starts in flight, then a
//! restart on the same directory. Each module is one theme; PostgreSQL's need feature
//! `postgres`, the EC2 broker's features `ec2` and `test-util` (moto's server).

// These tests drive real processes in real time: they sleep and read the wall clock.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

/// Command-line usage, `config`, `bench serve`.
mod cli;
/// Containers and manual machines (issue 14).
mod containers;
/// `kill -9` and SIGTERM with work in flight, a full disk: nothing lost, nothing doubled.
mod crash;
/// The dashboard's page, and the injected start failures it retries (issue 16).
mod dashboard;
/// The data directory: one service each, damaged databases, file modes.
mod data_dir;
/// The EC2 broker through the service, on moto.
#[cfg(all(feature = "ec2", feature = "test-util"))]
mod ec2;
/// The event stream, and its limits: revocation, caps (issue 30).
mod events;
/// A database that is not next door (issue 36): PostgreSQL 20 ms away behind a delaying proxy.
#[cfg(feature = "postgres")]
mod far;
/// Replicas on PostgreSQL with one fenced leader (issue 15): fail-over under faults.
#[cfg(feature = "postgres")]
mod ha;
/// Authentication, bodies, methods, sizes, the OpenAPI document.
mod http;
/// The LXD broker through the service, on real LXD daemons (issue 32).
#[cfg(all(feature = "lxd", feature = "test-util"))]
mod lxd;
/// Machines added, listed, removed, retried; the model destroyed.
mod machines;
/// `/metrics`: bounded labels, counts per zone, OpenMetrics.
mod metrics;
/// Constraints, placement, `machine show`, list filters and pages, applications (issue 14).
mod model;
/// Many models per service (issue 18).
mod models;
/// The service on PostgreSQL (issue 15): `--store postgres://...`.
#[cfg(feature = "postgres")]
mod postgres;
/// The models' leaders spread over the replicas (issue 18).
#[cfg(feature = "postgres")]
mod spread;
mod support;
/// TLS: `--tls-cert/--tls-key`, `--ca-cert`, plain HTTP off loopback.
mod tls;
/// Scoped API tokens and the audit log (issue 16).
mod tokens;
/// The service's spans as OpenTelemetry traces (issue 37).
#[cfg(feature = "otel")]
mod traces;
