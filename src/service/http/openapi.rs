//! The API's OpenAPI 3.1 document, derived from the handlers' `#[utoipa::path]` annotations
//! and the bodies' `ToSchema` derives, served at `GET /v1/openapi.json` (no token needed) and
//! committed as `docs/openapi.json` (a test keeps the copy in step: `UPDATE_OPENAPI=1 cargo
//! test --lib --features serve openapi` rewrites it).
//!
//! What every operation shares is added here, not per handler (one `Modify`): the bearer scheme
//! and its 401 on every `/v1` route, the 413 of every body, the JSON error body of a 500. The
//! links between operations (what schemathesis's stateful phase follows) are one table
//! ([`LINKS`]). A new route is one line in [`ApiDoc`]'s `paths(...)`.

use actix_web::HttpResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, OpenApi as Document, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use super::config::ConfigKey;
use super::wire::ErrorBody;

/// The OpenAPI document: every route, body, answer and error of the API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "provisioner",
        description = "The provisioner service's HTTP API: machines, applications, instances, settings, \
            status and events of its models. Every per-model route is also served under \
            `/v1/models/{model}/...` for the model it names; the plain `/v1/...` routes listed here mean the model \
            `default`. Every `/v1` route but this document needs `Authorization: Bearer \
            TOKEN` (the token file in the data directory, or one made with `POST /v1/tokens`); a read-only token \
            gets 403 on every change, a token scoped to one model 403 on every other. Errors are `{\"error\": \"one sentence\"}`; a refused \
            request (any 4xx) changes nothing.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        super::health::healthz,
        super::health::readyz,
        super::metrics::service_metrics,
        openapi_json,
        super::machines::list_machines,
        super::machines::add_machines,
        super::machines::show_machine,
        super::machines::remove_machines,
        super::machines::retry_machines,
        super::machines::set_machine_constraints,
        super::applications::list_applications,
        super::applications::add_application,
        super::applications::remove_application,
        super::instances::list_instances,
        super::drift::list_drift,
        super::config::list_config,
        super::config::get_config,
        super::config::set_config,
        super::status::status,
        super::metrics::model_metrics,
        super::destroy::destroy_model,
        super::events::events,
        super::tokens::create_token,
        super::tokens::list_tokens,
        super::tokens::revoke_token,
        super::models::list_models,
        super::models::add_model,
        super::models::show_model,
        super::models::destroy_model,
    ),
    components(schemas(crate::service::events::EventView, ErrorBody, ConfigKey, super::machines::StatusFilter)),
    modifiers(&Shared),
    tags(
        (name = "machines", description = "The model's machines"),
        (name = "applications", description = "Applications: their units' machines form a distribution group"),
        (name = "instances", description = "The cloud's instances, as the service's broker sees them"),
        (name = "config", description = "The model's settings"),
        (name = "model", description = "The model itself"),
        (name = "service", description = "Health, metrics, status, events and this document"),
        (name = "tokens", description = "API tokens (admin tokens only): create, list, revoke"),
        (name = "models", description = "The models the service hosts: add, list, show, destroy"),
    ),
)]
pub(crate) struct ApiDoc;

/// The operations a response links to (OpenAPI `links`, followed by stateful fuzzers): from
/// (operation, status) by a name to an operation, with its parameters and body as runtime
/// expressions.
pub(crate) const LINKS: &[LinkSpec] = &[
    LinkSpec {
        from: ("add_machines", "201"),
        name: "ShowFirstMachine",
        to: "show_machine",
        parameters: &[("id", "$response.body#/ids/0")],
        body: None,
    },
    LinkSpec {
        from: ("add_machines", "201"),
        name: "RemoveMachines",
        to: "remove_machines",
        parameters: &[],
        body: Some(r#"{"ids": "$response.body#/ids"}"#),
    },
    LinkSpec {
        from: ("add_machines", "201"),
        name: "ListAfter",
        to: "list_machines",
        parameters: &[("after", "$response.body#/ids/0")],
        body: None,
    },
    LinkSpec {
        from: ("add_application", "201"),
        name: "RemoveApplication",
        to: "remove_application",
        parameters: &[("name", "$response.body#/name")],
        body: None,
    },
    LinkSpec {
        from: ("add_application", "201"),
        name: "ListItsMachines",
        to: "list_machines",
        parameters: &[("application", "$response.body#/name")],
        body: None,
    },
    LinkSpec {
        from: ("add_application", "201"),
        name: "ShowFirstUnit",
        to: "show_machine",
        parameters: &[("id", "$response.body#/machines/0")],
        body: None,
    },
    LinkSpec {
        from: ("create_token", "201"),
        name: "RevokeIt",
        to: "revoke_token",
        parameters: &[("id", "$response.body#/id")],
        body: None,
    },
    LinkSpec {
        from: ("list_config", "200"),
        name: "GetFirst",
        to: "get_config",
        parameters: &[("key", "$response.body#/0/key")],
        body: None,
    },
];

/// One entry of [`LINKS`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinkSpec {
    /// The operation id and status whose response carries the link.
    pub from: (&'static str, &'static str),
    /// The link's name.
    pub name: &'static str,
    /// The operation id it leads to.
    pub to: &'static str,
    /// Its parameters: name, runtime expression.
    pub parameters: &'static [(&'static str, &'static str)],
    /// Its request body: JSON whose string values may be runtime expressions.
    pub body: Option<&'static str>,
}

/// The routes whose body may be left out (no body, or an empty one, means the defaults).
const OPTIONAL_BODIES: &[&str] = &["/v1/destroy-model"];

/// What every operation shares: security, 401, 413, 500; and the [`LINKS`].
struct Shared;

fn error(description: &str) -> RefOr<Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content("application/json", Content::new(Some(Ref::from_schema_name("ErrorBody"))))
            .build(),
    )
}

impl Modify for Shared {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The API token: the `token` file in the service's data directory"))
                    .build(),
            ),
        );
        for (path, item) in doc.paths.paths.iter_mut() {
            let secured = path.starts_with("/v1/") && path != "/v1/openapi.json";
            for (read, op) in [
                (true, &mut item.get),
                (false, &mut item.put),
                (false, &mut item.post),
                (false, &mut item.delete),
                (false, &mut item.options),
                (true, &mut item.head),
                (false, &mut item.patch),
                (false, &mut item.trace),
            ]
            .into_iter()
            .filter_map(|(read, op)| op.as_mut().map(|op| (read, op)))
            {
                let answers = &mut op.responses.responses;
                if secured {
                    op.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]);
                    answers.insert("401".into(), error("No API token, a wrong one, or a revoked one"));
                    if !read && !answers.contains_key("403") {
                        answers.insert("403".into(), error("The token is read-only: changes need an admin token"));
                    }
                }
                if let Some(body) = op.request_body.as_mut().filter(|_| OPTIONAL_BODIES.contains(&path.as_str())) {
                    // An optional body is no body or an empty one, not JSON `null`: the schema is
                    // the type's, the body not required.
                    body.required = Some(utoipa::openapi::Required::False);
                    for content in body.content.values_mut() {
                        if let Some(RefOr::T(utoipa::openapi::schema::Schema::OneOf(one))) = &content.schema {
                            let not_null = one.items.iter().find(|s| matches!(s, RefOr::Ref(_))).cloned();
                            content.schema = not_null;
                        }
                    }
                }
                if op.request_body.is_some() {
                    answers.insert(
                        "413".into(),
                        error(&format!("The body is over the limit of {} bytes", super::body::BODY_LIMIT)),
                    );
                }
                if path != "/healthz" {
                    answers.insert("500".into(), error("The store or the provisioner failed (the reason)"));
                }
            }
        }
    }
}

impl LinkSpec {
    /// The Link Object. Written as JSON, not with utoipa's `Link`: utoipa 5 serialises its
    /// fields in snake case (`operation_id`), which no tool reads.
    fn to_json(self) -> serde_json::Value {
        let mut link = serde_json::Map::new();
        link.insert("operationId".into(), self.to.into());
        if !self.parameters.is_empty() {
            let params = self.parameters.iter().map(|(k, v)| ((*k).to_owned(), (*v).into())).collect();
            link.insert("parameters".into(), serde_json::Value::Object(params));
        }
        if let Some(body) = self.body.and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok()) {
            link.insert("requestBody".into(), body);
        }
        serde_json::Value::Object(link)
    }
}

/// Adds the [`LINKS`] to the responses they start from.
fn add_links(doc: &mut serde_json::Value) {
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else { return };
    for item in paths.values_mut().filter_map(|i| i.as_object_mut()) {
        for op in item.values_mut() {
            let id = op.get("operationId").and_then(|i| i.as_str()).unwrap_or_default().to_owned();
            for link in LINKS.iter().filter(|l| l.from.0 == id) {
                if let Some(answer) =
                    op.pointer_mut(&format!("/responses/{}", link.from.1)).and_then(|a| a.as_object_mut())
                {
                    let links = answer.entry("links").or_insert_with(|| serde_json::json!({}));
                    if let Some(links) = links.as_object_mut() {
                        links.insert(link.name.to_owned(), link.to_json());
                    }
                }
            }
        }
    }
}

/// The document as JSON, pretty-printed with a final newline (what `docs/openapi.json` holds).
pub(crate) fn document_json() -> String {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    add_links(&mut doc);
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

/// The operation ids of the document, by path and method (for tests and tools).
#[cfg(test)]
pub(crate) fn operations() -> std::collections::BTreeMap<String, String> {
    let doc = ApiDoc::openapi();
    let mut out = std::collections::BTreeMap::new();
    for (path, item) in &doc.paths.paths {
        for (method, op) in [("GET", &item.get), ("PUT", &item.put), ("POST", &item.post), ("DELETE", &item.delete)] {
            if let Some(op) = op {
                out.insert(format!("{method} {path}"), op.operation_id.clone().unwrap_or_default());
            }
        }
    }
    out
}

/// `GET /v1/openapi.json`: this document (no token needed).
#[utoipa::path(get, path = "/v1/openapi.json", tag = "service", operation_id = "openapi",
    responses((status = 200, description = "The API's OpenAPI 3.1 document", content_type = "application/json",
        body = Object)))]
pub(crate) async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(document_json())
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
    const REFERENCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md");

    /// The committed API reference is the document rendered; `UPDATE_OPENAPI=1` rewrites it.
    #[test]
    fn the_committed_api_reference_is_the_openapi_document_rendered() {
        let doc: serde_json::Value = serde_json::from_str(&document_json()).unwrap();
        let generated = super::super::reference::markdown(&doc);
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(REFERENCE, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(REFERENCE).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/api.md differs from the API the code defines; refresh it with \
             `UPDATE_OPENAPI=1 cargo test --lib --features serve openapi` and commit it"
        );
    }

    /// The committed copy is what the code generates; `UPDATE_OPENAPI=1` rewrites it.
    #[test]
    fn the_committed_openapi_document_is_what_the_code_generates() {
        let generated = document_json();
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(COMMITTED, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json differs from the API the code defines; refresh it with \
             `UPDATE_OPENAPI=1 cargo test --lib --features serve openapi` and commit it"
        );
    }

    #[test]
    fn every_route_is_documented_with_its_errors_and_the_bearer_scheme() {
        let doc: serde_json::Value = serde_json::from_str(&document_json()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
        let ops = operations();
        for route in [
            "GET /healthz",
            "GET /metrics",
            "GET /v1/openapi.json",
            "GET /v1/machines",
            "POST /v1/machines",
            "GET /v1/machines/{id}",
            "POST /v1/machines/remove",
            "POST /v1/machines/retry",
            "PUT /v1/machines/{id}/constraints",
            "GET /v1/applications",
            "POST /v1/applications",
            "DELETE /v1/applications/{name}",
            "GET /v1/instances",
            "GET /v1/config",
            "GET /v1/config/{key}",
            "PUT /v1/config/{key}",
            "GET /v1/status",
            "GET /v1/metrics",
            "POST /v1/destroy-model",
            "GET /v1/events",
            "POST /v1/tokens",
            "GET /v1/tokens",
            "DELETE /v1/tokens/{id}",
        ] {
            assert!(ops.contains_key(route), "{route} is not in the document: {ops:?}");
        }
        for (route, id) in &ops {
            let (method, path) = route.split_once(' ').unwrap();
            let op = &doc["paths"][path][method.to_ascii_lowercase()];
            let secured = path.starts_with("/v1/") && path != "/v1/openapi.json";
            assert_eq!(op["security"].is_array(), secured, "{route} ({id}): security");
            assert_eq!(op["responses"]["401"].is_object(), secured, "{route}: 401");
            if secured && method != "GET" {
                assert!(op["responses"]["403"].is_object(), "{route}: a read-only token's 403");
            }
            if op["requestBody"].is_object() {
                assert!(op["responses"]["413"].is_object(), "{route}: 413");
                assert!(op["responses"]["400"].is_object(), "{route}: 400");
            }
            for (code, answer) in op["responses"].as_object().unwrap() {
                if code.starts_with('4') || code == "500" {
                    assert_eq!(
                        answer["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody",
                        "{route} {code}: the JSON error body"
                    );
                }
            }
        }
        assert!(doc["paths"]["/v1/events"]["get"]["responses"]["200"]["content"]["text/event-stream"].is_object());
        let link = &doc["paths"]["/v1/machines"]["post"]["responses"]["201"]["links"]["ShowFirstMachine"];
        assert_eq!(link["operationId"], "show_machine");
        assert_eq!(link["parameters"]["id"], "$response.body#/ids/0");
    }

    /// schemathesis found these: the document said `destroy-model` takes JSON `null` (the
    /// service refuses it: no body means the defaults), and left out the 400 of an empty
    /// machine id.
    #[test]
    fn the_document_says_what_the_service_does_where_fuzzing_found_it_did_not() {
        let doc: serde_json::Value = serde_json::from_str(&document_json()).unwrap();
        let body = &doc["paths"]["/v1/destroy-model"]["post"]["requestBody"];
        assert_eq!(body["required"], false, "{body}");
        assert_eq!(
            body["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/DestroyRequest",
            "{body}"
        );
        let e =
            super::super::body::parse_body::<crate::service::http::wire::DestroyRequest>(b"null", None).unwrap_err();
        assert_eq!(e.status, 400, "the service refuses null");
        assert!(doc["paths"]["/v1/machines/{id}"]["get"]["responses"]["400"].is_object());
        assert_eq!(super::super::machines::machine_id_of_path("%2F").unwrap_err().status, 400);
        // Every body the service takes is strict: the document says so (additionalProperties).
        for name in [
            "AddMachines",
            "RemoveMachines",
            "RetryMachines",
            "SetConstraints",
            "ConfigValue",
            "DestroyRequest",
            "AddApplication",
            "CreateToken",
        ] {
            assert_eq!(doc["components"]["schemas"][name]["additionalProperties"], false, "{name}");
        }
    }

    #[test]
    fn every_link_leads_to_an_operation_that_takes_what_it_gives() {
        let doc: serde_json::Value = serde_json::from_str(&document_json()).unwrap();
        let ops = operations();
        for l in LINKS {
            assert!(ops.values().any(|id| id == l.from.0), "{}: no operation {}", l.name, l.from.0);
            let to = ops.iter().find(|(_, id)| *id == l.to).map(|(r, _)| r.clone());
            let to = to.unwrap_or_else(|| panic!("{}: no operation {}", l.name, l.to));
            let (method, path) = to.split_once(' ').unwrap();
            let params = doc["paths"][path][method.to_ascii_lowercase()]["parameters"].as_array().cloned();
            for (name, _) in l.parameters {
                assert!(
                    params.iter().flatten().any(|p| p["name"] == *name),
                    "{}: {to} takes no parameter {name}",
                    l.name
                );
            }
            if let Some(body) = l.body {
                assert!(serde_json::from_str::<serde_json::Value>(body).is_ok(), "{}: body", l.name);
            }
        }
    }
}
