//! The dashboard at `GET /`: one page of plain HTML, CSS and JavaScript, embedded in the
//! binary (`include_str!` of the files beside this one) and served without a token; every
//! call the page makes for data (`/v1/...`) sends the API token, which it asks for once.
//!
//! | path | file |
//! |---|---|
//! | `/` | `index.html` |
//! | `/dashboard/app.js` | `app.js`: state, actions, the event stream (read with `fetch`) |
//! | `/dashboard/app.css` | `app.css` |
//! | `/dashboard/icon.svg` | `icon.svg` |
//!
//! Nothing is loaded from anywhere else (the machines it runs on may have no internet), and
//! the [`CSP`] every answer carries says so to the browser: scripts, styles, images and
//! connections from this origin only, no inline script, no frames. The routes are left out
//! of the OpenAPI document: it describes the API, and the page is a client of that API. They
//! are in the route table beside the API's ([`super::routes::dashboard_routes`]).

use actix_web::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, X_CONTENT_TYPE_OPTIONS};
use actix_web::HttpResponse;

/// The page.
pub(crate) const INDEX_HTML: &str = include_str!("index.html");
/// The page's script.
pub(crate) const APP_JS: &str = include_str!("app.js");
/// The page's style sheet.
pub(crate) const APP_CSS: &str = include_str!("app.css");
/// The page's icon.
pub(crate) const ICON_SVG: &str = include_str!("icon.svg");

/// The Content-Security-Policy of every dashboard answer: this origin only, nothing inline.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                       connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The embedded files by path, with their content types.
pub(crate) const ASSETS: [(&str, &str, &str); 4] = [
    ("/", "text/html; charset=utf-8", INDEX_HTML),
    ("/dashboard/app.js", "text/javascript; charset=utf-8", APP_JS),
    ("/dashboard/app.css", "text/css; charset=utf-8", APP_CSS),
    ("/dashboard/icon.svg", "image/svg+xml", ICON_SVG),
];

/// The answer of one of the [`ASSETS`]: the file with its type, the [`CSP`], and no caching
/// without revalidation.
pub(super) fn answer(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((CONTENT_SECURITY_POLICY, CSP))
        .insert_header((X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header(("Referrer-Policy", "no-referrer"))
        // The files change with the binary: always revalidate.
        .insert_header((CACHE_CONTROL, "no-cache"))
        .body(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `src`/`href` of the page and every URL in its files: this origin only.
    #[test]
    fn the_page_loads_nothing_from_outside() {
        for (path, _, body) in ASSETS {
            // The icon's `xmlns` is the SVG namespace's name, which nothing fetches.
            let text = body.to_ascii_lowercase().replace(r#"xmlns="http://www.w3.org/2000/svg""#, "");
            for outside in ["http://", "https://", "//cdn", "@import", "url("] {
                assert!(!text.contains(outside), "{path} names {outside}");
            }
        }
        for asset in ["/dashboard/app.js", "/dashboard/app.css", "/dashboard/icon.svg"] {
            assert!(INDEX_HTML.contains(asset), "the page does not use {asset}");
        }
        assert!(
            !INDEX_HTML.contains("<script>") && !INDEX_HTML.contains("style="),
            "nothing inline (the CSP forbids it)"
        );
        assert!(!CSP.contains("http") && !CSP.contains('*') && !CSP.contains("unsafe"), "{CSP}");
    }

    /// `/` and the assets answer 200 with their types and the CSP, with no token.
    #[test]
    fn the_routes_serve_the_embedded_files() {
        use actix_web::test;
        actix_rt::System::new().block_on(async {
            let app = test::init_service(actix_web::App::new().configure(super::super::routes::dashboard_routes)).await;
            for (path, content_type, body) in ASSETS {
                let res = test::call_service(&app, test::TestRequest::get().uri(path).to_request()).await;
                assert_eq!(res.status(), 200, "{path}");
                let header = |h| res.headers().get(h).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                assert_eq!(header(actix_web::http::header::CONTENT_TYPE), content_type, "{path}");
                assert_eq!(header(CONTENT_SECURITY_POLICY), CSP, "{path}");
                assert_eq!(test::read_body(res).await, body.as_bytes(), "{path}");
                let res = test::call_service(&app, test::TestRequest::post().uri(path).to_request()).await;
                assert_eq!(res.status(), 405, "{path}");
            }
        });
    }
}
