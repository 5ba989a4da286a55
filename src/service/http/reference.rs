//! The API reference a person reads (`docs/api.md`), rendered from the OpenAPI document, so the
//! two never disagree: every operation by tag (method, path, what it does, its parameters, its
//! body, its answers), then every schema with its fields. A test keeps the committed page in
//! step with the code (`UPDATE_OPENAPI=1 cargo test --lib --features serve openapi` rewrites it,
//! with `docs/openapi.json`).
//!
//! Plain: it reads the document as JSON, so it depends on the OpenAPI format, not on `utoipa`.

use std::fmt::Write as _;

use serde_json::Value;

/// The Markdown reference of an OpenAPI 3.1 document.
pub(crate) fn markdown(doc: &Value) -> String {
    let mut out = String::new();
    let title = doc["info"]["title"].as_str().unwrap_or("API");
    let _ = writeln!(out, "# The {title} HTTP API\n");
    let _ = writeln!(
        out,
        "<!-- Generated from docs/openapi.json by src/service/http/reference.rs: do not edit by hand; \
         `UPDATE_OPENAPI=1 cargo test --lib --features serve openapi` refreshes both. -->\n"
    );
    if let Some(d) = doc["info"]["description"].as_str() {
        let _ = writeln!(out, "{}\n", d.trim());
    }
    let ops = operations(doc);
    let tags: Vec<(String, String)> = doc["tags"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| (text(&t["name"]), text(&t["description"])))
                .filter(|(name, _)| ops.iter().any(|o| o.tag == *name))
                .collect()
        })
        .unwrap_or_default();
    let _ = writeln!(out, "## Operations\n");
    for (tag, description) in &tags {
        let _ = writeln!(out, "- [{tag}](#{tag}): {description}");
    }
    let _ = writeln!(out, "- [Schemas](#schemas): the bodies' and answers' fields\n");
    for (tag, description) in &tags {
        let _ = writeln!(out, "### {tag}\n\n{description}.\n");
        for op in ops.iter().filter(|o| o.tag == *tag) {
            operation(&mut out, op.method, op.path, op.body);
        }
    }
    let untagged: Vec<&Op> = ops.iter().filter(|o| !tags.iter().any(|(t, _)| *t == o.tag)).collect();
    if !untagged.is_empty() {
        let _ = writeln!(out, "### other\n");
        for op in untagged {
            operation(&mut out, op.method, op.path, op.body);
        }
    }
    let _ = writeln!(out, "## Schemas\n");
    if let Some(schemas) = doc["components"]["schemas"].as_object() {
        for (name, schema) in schemas {
            schema_section(&mut out, name, schema);
        }
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// One operation of the document.
struct Op<'a> {
    tag: String,
    method: &'a str,
    path: &'a str,
    body: &'a Value,
}

/// Every operation, in the document's path order and a fixed method order.
fn operations(doc: &Value) -> Vec<Op<'_>> {
    let mut ops = Vec::new();
    let Some(paths) = doc["paths"].as_object() else { return ops };
    for (path, item) in paths {
        for method in ["get", "post", "put", "patch", "delete"] {
            let body = &item[method];
            if body.is_object() {
                let tag = body["tags"][0].as_str().unwrap_or("other").to_owned();
                ops.push(Op { tag, method, path, body });
            }
        }
    }
    ops
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().trim().to_owned()
}

/// A table cell: one line, pipes escaped.
fn cell(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

fn operation(out: &mut String, method: &str, path: &str, op: &Value) {
    let _ = writeln!(out, "#### `{} {path}`\n", method.to_uppercase());
    let summary = text(&op["summary"]);
    let description = text(&op["description"]);
    for part in [summary, description].iter().filter(|p| !p.is_empty()) {
        let _ = writeln!(out, "{part}\n");
    }
    if op["security"].as_array().is_some_and(|s| !s.is_empty()) {
        let _ = writeln!(out, "Needs `Authorization: Bearer TOKEN`.\n");
    }
    if let Some(params) = op["parameters"].as_array().filter(|p| !p.is_empty()) {
        let _ = writeln!(out, "| parameter | in | required | type | description |\n|---|---|---|---|---|");
        for p in params {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} |",
                text(&p["name"]),
                text(&p["in"]),
                if p["required"].as_bool() == Some(true) { "yes" } else { "no" },
                cell(&type_of(&p["schema"])),
                cell(&text(&p["description"])),
            );
        }
        let _ = writeln!(out);
    }
    let body = &op["requestBody"];
    if body.is_object() {
        let required = if body["required"].as_bool() == Some(true) { "required" } else { "optional" };
        let kinds = content_types(&body["content"]);
        let _ = writeln!(out, "Body ({required}): {kinds}. {}\n", cell(&text(&body["description"])).trim());
    }
    if let Some(responses) = op["responses"].as_object() {
        let _ = writeln!(out, "| answer | body | when |\n|---|---|---|");
        for (code, r) in responses {
            let _ = writeln!(
                out,
                "| {code} | {} | {} |",
                cell(&content_types(&r["content"])),
                cell(&text(&r["description"]))
            );
        }
        let _ = writeln!(out);
    }
}

/// `application/json` [`Schema`](#schema), ... or `none`.
fn content_types(content: &Value) -> String {
    let Some(content) = content.as_object().filter(|c| !c.is_empty()) else { return "none".into() };
    content.iter().map(|(kind, c)| format!("`{kind}` {}", type_of(&c["schema"]))).collect::<Vec<_>>().join(", ")
}

/// A schema's type as a reader wants it: a link to a named schema, `array of ...`, a scalar
/// with its format, or the alternatives of a `oneOf`.
fn type_of(schema: &Value) -> String {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap_or(r);
        return format!("[{name}](#{})", name.to_lowercase());
    }
    if let Some(alts) = schema["oneOf"].as_array().or_else(|| schema["anyOf"].as_array()) {
        return alts.iter().map(type_of).collect::<Vec<_>>().join(" or ");
    }
    let kinds: Vec<String> = match &schema["type"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(ts) => ts.iter().filter_map(|t| t.as_str().map(str::to_owned)).collect(),
        _ if schema["enum"].is_array() => vec!["string".into()],
        _ => vec!["any".into()],
    };
    kinds
        .iter()
        .map(|k| match k.as_str() {
            "array" => format!("array of {}", type_of(&schema["items"])),
            "string" if schema["enum"].is_array() => one_of_values(&schema["enum"]),
            other => match schema["format"].as_str() {
                Some(f) => format!("{other} ({f})"),
                None => other.to_owned(),
            },
        })
        .collect::<Vec<_>>()
        .join(" or ")
}

fn one_of_values(values: &Value) -> String {
    let names: Vec<String> =
        values.as_array().into_iter().flatten().map(|v| format!("`{}`", v.as_str().unwrap_or_default())).collect();
    format!("one of {}", names.join(", "))
}

fn schema_section(out: &mut String, name: &str, schema: &Value) {
    let _ = writeln!(out, "### {name}\n");
    let description = text(&schema["description"]);
    if !description.is_empty() {
        let _ = writeln!(out, "{description}\n");
    }
    let Some(props) = schema["properties"].as_object() else {
        let _ = writeln!(out, "Type: {}.\n", type_of(schema));
        return;
    };
    let required: Vec<&str> = schema["required"].as_array().into_iter().flatten().filter_map(|r| r.as_str()).collect();
    let _ = writeln!(out, "| field | type | required | description |\n|---|---|---|---|");
    for (field, p) in props {
        let mut description = text(&p["description"]);
        if description.is_empty() {
            if let Some(alt) = p["oneOf"].as_array().and_then(|a| a.iter().find_map(|s| s["description"].as_str())) {
                description = alt.trim().to_owned();
            }
        }
        let _ = writeln!(
            out,
            "| `{field}` | {} | {} | {} |",
            cell(&type_of(p)),
            if required.contains(&field.as_str()) { "yes" } else { "no" },
            cell(&description),
        );
    }
    let _ = writeln!(out);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn operations_parameters_answers_and_schemas_are_rendered() {
        let doc = json!({
            "info": {"title": "t", "description": "What it is."},
            "tags": [{"name": "machines", "description": "The machines"}],
            "paths": {"/v1/machines": {"get": {
                "tags": ["machines"], "summary": "List them.", "security": [{"bearer": []}],
                "parameters": [{"name": "limit", "in": "query", "required": false,
                                "schema": {"type": "integer", "format": "int32"}, "description": "At most | this."}],
                "responses": {"200": {"description": "The page", "content": {"application/json":
                    {"schema": {"type": "array", "items": {"$ref": "#/components/schemas/MachineView"}}}}}}
            }}},
            "components": {"schemas": {"MachineView": {"description": "One machine.", "required": ["id"],
                "properties": {"id": {"type": "string", "description": "Its id."},
                               "zone": {"type": ["string", "null"]},
                               "life": {"type": "string", "enum": ["alive", "dead"]}}}}}
        });
        let md = markdown(&doc);
        assert!(md.starts_with("# The t HTTP API\n"), "{md}");
        assert!(md.contains("#### `GET /v1/machines`\n\nList them.\n\nNeeds `Authorization: Bearer TOKEN`."), "{md}");
        assert!(md.contains("| `limit` | query | no | integer (int32) | At most \\| this. |"), "{md}");
        assert!(md.contains("| 200 | `application/json` array of [MachineView](#machineview) | The page |"), "{md}");
        assert!(md.contains("| `id` | string | yes | Its id. |"), "{md}");
        assert!(md.contains("| `zone` | string or null | no |  |"), "{md}");
        assert!(md.contains("| `life` | one of `alive`, `dead` | no |"), "{md}");
    }
}
