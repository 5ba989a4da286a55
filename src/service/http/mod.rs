//! The HTTP layer of `provisioner serve`: `/healthz`, `/metrics`, and JSON under `/v1` behind a
//! bearer token, and the dashboard.
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `GET /healthz` | | `ok` (no token needed) |
//! | `GET /readyz` | | `ready` when this replica can serve (its store reachable), else 503 (no token needed) |
//! | `GET /metrics` | | OpenMetrics text (no token needed) |
//! | `GET /v1/machines?application=&status=&zone=&after=&limit=` | | `[MachineView]` |
//! | `POST /v1/machines` | `AddMachines` (`count`, `zones`, `constraints`, `placement`; or `container` and `host`; or `manual` and `address`) | `201 AddedMachines` |
//! | `GET /v1/machines/{id}` | | `MachineDetail` (`{id}` may hold `/`: `3/lxd/0`) |
//! | `GET /v1/applications` | | `[ApplicationView]` |
//! | `POST /v1/applications` | `AddApplication` | `201 ApplicationView` |
//! | `DELETE /v1/applications/{name}` | | `ApplicationView` (the machines taken to dead) |
//! | `POST /v1/machines/remove` | `RemoveMachines` (`force` also takes a host's live containers) | `204` |
//! | `POST /v1/machines/retry` | `RetryMachines` | `204` |
//! | `PUT /v1/machines/{id}/constraints` | `SetConstraints` (`constraints`, Juju's syntax) | `MachineDetail` (409 a machine not alive, or manual) |
//! | `GET /v1/instances` | | `[InstanceView]` |
//! | `GET /v1/config` | | `[ConfigValue]` |
//! | `GET /v1/config/{key}` | | `ConfigValue` |
//! | `PUT /v1/config/{key}` | `ConfigValue` (`value`) | `ConfigValue` |
//! | `GET /v1/status` | | `StatusView` |
//! | `POST /v1/destroy-model` | `DestroyRequest` | `DestroyView` (409 naming live manual machines unless `force`) |
//! | `GET /v1/events` | | `text/event-stream` of `EventView`s |
//! | `GET /v1/openapi.json` | | this table as an OpenAPI 3.1 document ([`openapi`]; no token needed) |
//! | `POST /v1/tokens` | `CreateToken` (`read_only`) | `201 CreatedToken` (the token, shown once; admin tokens only) |
//! | `GET /v1/tokens` | | `[TokenView]` (never a token or a hash; admin tokens only) |
//! | `DELETE /v1/tokens/{id}` | | `TokenView` (404 unknown id, 409 `admin`; admin tokens only) |
//! | `GET /` (and `/dashboard/...`) | | the dashboard ([`dashboard`]; no token needed, not in the OpenAPI document) |
//!
//! Tokens ([`crate::service::token`]): the [`Authorized`] extractor proves the bearer token
//! (the admin token by hash in memory, a created one looked up in the store on every request)
//! and refuses a read-only token's change (any method but `GET`/`HEAD`) with 403. Every change
//! request writes one audit line ([`crate::service::audit`]) from [`app`]'s `wrap_fn`.
//!
//! Errors are `{"error": "one sentence"}` with 400 (bad input: a body that does not parse, an
//! unknown field, a wrong type, a value out of range), 401 (no, wrong or revoked token), 403 (a
//! read-only token's change, or its token management), 404 (no such
//! machine or route), 405 (a method the route does not take; `Allow` lists those it does), 409
//! (the model's state refuses it), 413 (a body over [`BODY_LIMIT`]), 429 (`/v1/events`: a cap
//! on event streams reached, named with its config key), 500, or 503 (`/healthz`,
//! `/readyz`: the store cannot be read; any request: the database cannot be reached, so no
//! answer is given rather than a stale one). A refused request writes nothing.
//!
//! One file by role, one by URL resource:
//!
//! | file | what |
//! |---|---|
//! | [`routes`] | the route table, [`app`] (request deadline, audit line, metrics of every request) |
//! | [`errors`] | [`ApiError`] and the statuses the service's errors map to |
//! | [`auth`] | the bearer check: [`Caller`], the extractors [`Authorized`] and [`AdminOnly`] |
//! | [`target`] | the model a request names, and its runtime ([`ModelState`]) |
//! | [`body`] | reading and parsing JSON bodies ([`BODY_LIMIT`]) |
//! | [`machines`] | `/v1/machines`: add (incl. containers and manual machines), list, show, remove, retry, constraints |
//! | [`applications`] | `/v1/applications` |
//! | [`instances`] | `/v1/instances` |
//! | [`config`] | `/v1/config` |
//! | [`status`] | `/v1/status` |
//! | [`destroy`] | `/v1/destroy-model` |
//! | [`events`] | `/v1/events` |
//! | [`metrics`] | `/metrics`, `/v1/metrics` |
//! | [`health`] | `/healthz`, `/readyz`, and the server that answers while the database is awaited |
//! | [`models`] | `/v1/models` (the models the service hosts) |
//! | [`tokens`] | `/v1/tokens` |
//! | [`wire`] | the JSON bodies, shared with the client commands (which import this module alone) |
//! | [`openapi`] | the OpenAPI document and `/v1/openapi.json` |
//! | `reference` (tests) | `docs/api.md`, rendered from the OpenAPI document |
//! | [`dashboard`] | the dashboard's page and files, served by [`routes`] |

pub(crate) mod applications;
pub(crate) mod auth;
pub(crate) mod body;
pub(crate) mod config;
pub(crate) mod dashboard;
pub(crate) mod destroy;
pub(crate) mod drift;
pub(crate) mod errors;
pub(crate) mod events;
pub(crate) mod health;
pub(crate) mod instances;
pub(crate) mod machines;
pub(crate) mod metrics;
pub(crate) mod models;
pub(crate) mod openapi;
#[cfg(test)]
mod reference;
pub(crate) mod routes;
pub(crate) mod status;
pub(crate) mod target;
pub(crate) mod tokens;
pub mod wire;

#[cfg(feature = "postgres")]
pub(crate) use health::start_waiting_server;
pub(crate) use routes::app;
