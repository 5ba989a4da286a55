//! `/v1/config`: the model's settings (`harvest-mode`, `workers`, `repair-after`, `repair-max-unhealthy`,
//! `replace-drifted`, `drift-budget`): list, get, and set (validated,
//! persisted so the value survives a restart, then applied to the running provisioners).

use actix_web::{web, HttpRequest, HttpResponse};
use utoipa::ToSchema;

use super::auth::{note, Authorized};
use super::body::json_body;
use super::errors::{ApiError, Result};
use super::target::State;
use super::wire::{ConfigValue, ErrorBody};
use crate::config::repair::{
    parse_drift_budget, parse_repair_after, parse_replace_drifted, show_repair_after, RepairError,
};
use crate::config::{validate_workers, MAX_WORKERS};
use crate::model::HarvestMode;
use crate::service::runtime::ModelRuntime;

/// The settings `GET`/`PUT /v1/config/{key}` know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, ToSchema)]
pub(crate) enum ConfigKey {
    /// Which instances are stopped: `none`, `unknown`, `destroyed` or `all`.
    #[serde(rename = "harvest-mode")]
    HarvestMode,
    /// The worker pool's size (1..=100).
    #[serde(rename = "workers")]
    Workers,
    /// How long an instance stays stopped before its machine is repaired: a duration such as
    /// `10m`, or `off` (the default: a stopped instance is kept).
    #[serde(rename = "repair-after")]
    RepairAfter,
    /// How many machines are repaired at a time: a count (`3`) or a percentage (`20%`, the
    /// default); more unhealthy at once hold every repair back.
    #[serde(rename = "repair-max-unhealthy")]
    RepairMaxUnhealthy,
    /// Whether drifted machines are replaced through the hand-over: `true` or `false` (the
    /// default: drift is reported only).
    #[serde(rename = "replace-drifted")]
    ReplaceDrifted,
    /// How many drifted machines are replaced at a time (1 or more; default 1).
    #[serde(rename = "drift-budget")]
    DriftBudget,
}

/// A path's `{key}` (taken by name: per-model paths also hold `{model}`).
#[derive(serde::Deserialize)]
pub(crate) struct KeyPath {
    key: String,
}

const CONFIG_KEYS: [&str; 6] =
    ["harvest-mode", "workers", "repair-after", "repair-max-unhealthy", "replace-drifted", "drift-budget"];

async fn config_value(st: &ModelRuntime, key: &str) -> Result<ConfigValue> {
    let value = match key {
        "harvest-mode" => st.running().await?.handle.harvest_mode().await?.to_string(),
        "workers" => st.running().await?.handle.pool().await?.size.to_string(),
        "repair-after" => show_repair_after(st.running().await?.handle.health().await?.policy.after),
        "repair-max-unhealthy" => st.running().await?.handle.health().await?.policy.max_unhealthy.to_string(),
        "replace-drifted" => st.running().await?.handle.health().await?.policy.replace_drifted.to_string(),
        "drift-budget" => st.running().await?.handle.health().await?.policy.drift_budget.to_string(),
        other => {
            return Err(ApiError::new(
                404,
                format!("unknown config key {other:?}: expected one of {}", CONFIG_KEYS.join(", ")),
            ))
        }
    };
    Ok(ConfigValue { key: key.to_owned(), value })
}

#[utoipa::path(get, path = "/v1/config/{key}", tag = "config", operation_id = "get_config",
    params(("key" = ConfigKey, Path, description = "The setting")),
    responses(
        (status = 200, description = "The setting's value", body = ConfigValue),
        (status = 404, description = "No such setting", body = ErrorBody),
    ))]
pub(super) async fn get_config(_: Authorized, st: State, key: web::Path<KeyPath>) -> Result<HttpResponse> {
    Ok(HttpResponse::Ok().json(config_value(&st, &key.key).await?))
}

#[utoipa::path(get, path = "/v1/config", tag = "config", operation_id = "list_config",
    responses((status = 200, description = "Every setting", body = Vec<ConfigValue>)))]
pub(super) async fn list_config(_: Authorized, st: State) -> Result<HttpResponse> {
    let mut out = Vec::new();
    for key in CONFIG_KEYS {
        out.push(config_value(&st, key).await?);
    }
    Ok(HttpResponse::Ok().json(out))
}

#[utoipa::path(put, path = "/v1/config/{key}", tag = "config", operation_id = "set_config",
    params(("key" = ConfigKey, Path, description = "The setting")),
    request_body(content = ConfigValue, description = "`value`: a harvest mode (`none`, `unknown`, `destroyed`, \
        `all`), a worker count (1..=100, digits only), a repair-after duration (`10m`, or `off`), a \
        repair-max-unhealthy count or percentage (`3`, `20%`), replace-drifted `true` or `false`, or a \
        drift-budget (1 or more); `key`, if given, is ignored"),
    responses(
        (status = 200, description = "The value now in force", body = ConfigValue),
        (status = 400, description = "The value is wrong for the setting, or the body does not parse", body = ErrorBody),
        (status = 404, description = "No such setting", body = ErrorBody),
    ))]
/// Validates, persists (so the value survives a restart), then applies.
pub(super) async fn set_config(
    _: Authorized,
    st: State,
    key: web::Path<KeyPath>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse> {
    let key = key.into_inner().key;
    let body: ConfigValue = json_body(&req, payload).await?;
    let mut value = body.value.trim().to_owned();
    note(&req, format!("set {} to {value:?}", key.as_str()));
    match key.as_str() {
        "harvest-mode" => {
            let mode: HarvestMode =
                value.parse().map_err(|e: crate::model::ParseError| ApiError::bad_request(e.to_string()))?;
            let running = st.running().await?;
            st.store.exec(move |s| s.set_harvest_mode(mode)).await?;
            running.handle.set_harvest_mode(mode);
            if let Some(c) = &running.containers {
                c.set_harvest_mode(mode);
            }
            value = mode.to_string();
        }
        "workers" => {
            // Digits only: `+4` reads like "four more", which is not what would be stored.
            let n: usize = Some(&value)
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "workers must be a whole number such as 4 (no sign: relative changes are not supported), got {value:?}"
                    ))
                })?;
            value = n.to_string();
            validate_workers(n, MAX_WORKERS).map_err(|e| ApiError::bad_request(e.to_string()))?;
            let running = st.running().await?;
            st.store.exec(move |s| s.set_workers(n)).await?;
            running.handle.set_workers(n).await?;
        }
        "repair-after" | "repair-max-unhealthy" | "replace-drifted" | "drift-budget" => {
            let running = st.running().await?;
            let mut policy = running.handle.health().await?.policy;
            let bad = |e: RepairError| ApiError::bad_request(e.to_string());
            match key.as_str() {
                "repair-after" => {
                    policy.after = parse_repair_after(&value).map_err(bad)?;
                    value = show_repair_after(policy.after);
                }
                "repair-max-unhealthy" => {
                    policy.max_unhealthy = value.parse().map_err(bad)?;
                    value = policy.max_unhealthy.to_string();
                }
                "replace-drifted" => {
                    policy.replace_drifted = parse_replace_drifted(&value).map_err(bad)?;
                    value = policy.replace_drifted.to_string();
                }
                _ => {
                    policy.drift_budget = parse_drift_budget(&value).map_err(bad)?;
                    value = policy.drift_budget.to_string();
                }
            }
            st.store.exec(move |s| s.set_repair(policy)).await?;
            running.handle.set_repair_policy(policy);
        }
        other => {
            return Err(ApiError::new(
                404,
                format!("unknown config key {other:?}: expected one of {}", CONFIG_KEYS.join(", ")),
            ))
        }
    }
    Ok(HttpResponse::Ok().json(ConfigValue { key, value }))
}
