//! Request bodies: read with a limit ([`BODY_LIMIT`], 413 past it), then parsed strictly as
//! one JSON object (unknown fields and wrong types refused with a 400 naming the field).

use actix_web::http::header::CONTENT_LENGTH;
use actix_web::{web, HttpRequest};

use super::errors::{ApiError, Result};

/// The largest request body, in bytes (larger: 413). 10,000 machine ids fit comfortably.
pub(crate) const BODY_LIMIT: usize = 256 << 10;

/// The 413 of a body over [`BODY_LIMIT`].
fn too_large() -> ApiError {
    ApiError::new(413, format!("the request body is over the limit of {BODY_LIMIT} bytes"))
}

/// Reads a request body of at most [`BODY_LIMIT`] bytes (413 past it, before reading it all
/// when the length is announced).
pub(super) async fn read_body(req: &HttpRequest, mut payload: web::Payload) -> Result<web::Bytes> {
    use futures::StreamExt;
    let announced = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > BODY_LIMIT as u64) {
        return Err(too_large());
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| match e {
            actix_web::error::PayloadError::Overflow => too_large(),
            other => ApiError::bad_request(format!("cannot read the request body: {other}")),
        })?;
        if body.len() + chunk.len() > BODY_LIMIT {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// The key of the JSON object member whose value starts before byte `offset` (flat bodies:
/// the last `"key":` before it), to name the field a type error is about.
fn key_before(body: &[u8], offset: usize) -> Option<String> {
    let text = std::str::from_utf8(&body[..offset.min(body.len())]).ok()?;
    let colon = text.rfind(':')?;
    let key = text[..colon].trim_end().strip_suffix('"')?;
    let start = key.rfind('"')?;
    Some(key[start + 1..].to_owned())
}

/// Parses a body strictly (unknown fields and wrong types are refused, naming the field).
/// An empty body means `empty`, if the request has defaults; otherwise it is refused.
pub(super) fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], empty: Option<T>) -> Result<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return empty.ok_or_else(|| ApiError::bad_request("a JSON body is required"));
    }
    // Every body is an object: serde would also read a struct from an array of its fields
    // (`[]` taking every default), which no client means.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request("invalid JSON body: expected a JSON object ({...})"));
    }
    serde_json::from_slice(body).map_err(|e| {
        let mut message = e.to_string();
        if e.classify() == serde_json::error::Category::Data && !message.contains("field") {
            let offset =
                body.split(|b| *b == b'\n').take(e.line().saturating_sub(1)).map(|l| l.len() + 1).sum::<usize>()
                    + e.column();
            if let Some(key) = key_before(body, offset) {
                message = format!("field {key:?}: {message}");
            }
        }
        ApiError::bad_request(format!("invalid JSON body: {message}"))
    })
}

/// Reads and parses a body that must be given.
pub(super) async fn json_body<T: serde::de::DeserializeOwned>(req: &HttpRequest, payload: web::Payload) -> Result<T> {
    parse_body(&read_body(req, payload).await?, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::http::wire::{DestroyRequest, RemoveMachines};

    #[test]
    fn type_errors_name_their_field_and_empty_bodies_take_the_defaults() {
        let e = parse_body::<DestroyRequest>(br#"{"force": "yes"}"#, None).unwrap_err();
        assert!(e.message.contains("\"force\""), "{e}");
        let e = parse_body::<DestroyRequest>(br#"{"forse": true}"#, None).unwrap_err();
        assert!(e.message.contains("forse"), "{e}");
        let e = parse_body::<RemoveMachines>(b"{\n  \"ids\": [\"1\"],\n  \"force\": 3\n}", None).unwrap_err();
        assert!(e.message.contains("\"force\""), "{e}");
        assert_eq!(parse_body(b"  ", Some(DestroyRequest::default())).unwrap(), DestroyRequest::default());
        assert_eq!(parse_body::<DestroyRequest>(b"", None).unwrap_err().status, 400);
        // schemathesis found `[]` taken as a struct with every default.
        let e = parse_body::<DestroyRequest>(b" []", None).unwrap_err();
        assert!(e.status == 400 && e.message.contains("JSON object"), "{e}");
        assert_eq!(parse_body::<DestroyRequest>(b" {}", None).unwrap(), DestroyRequest::default());
    }
}
