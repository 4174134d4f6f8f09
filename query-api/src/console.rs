//! The operators' console at `/console` and the GraphiQL page at `GET /graphql`, both served from
//! files compiled into the binary (`query-api/console/`, and the pinned GraphiQL, React and
//! ReactDOM builds in `query-api/vendor/`, see `vendor/VENDORED.md`). Nothing they load comes
//! from another host, and every response carries a Content-Security-Policy that forbids it
//! anyway: scripts, styles, fonts, images and connections from this origin only, no inline
//! script, no framing. The console keeps the operator's admin token in the tab's
//! `sessionStorage` and sends it as a bearer header; no cookie carries authority
//! (`docs/adr/0008-console.md`).

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::response::{IntoResponse, Response};

use edge::routes::Routes;

/// The policy of every console and GraphiQL response. `data:` fonts and images are GraphiQL's
/// stylesheet's embedded fonts and icons; `connect-src 'self'` covers the API, the feed's
/// server-sent events and GraphQL's same-origin websocket.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; font-src 'self' data:; connect-src 'self'; \
     manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; \
     object-src 'none'";

/// One file served under `/console/`.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every file the console and the GraphiQL page load, by the name after `/console/`.
const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: JS,
        body: include_bytes!("../console/app.js"),
    },
    Asset {
        name: "app.css",
        content_type: CSS,
        body: include_bytes!("../console/app.css"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../console/favicon.svg"),
    },
    Asset {
        name: "graphiql-start.js",
        content_type: JS,
        body: include_bytes!("../console/graphiql-start.js"),
    },
    Asset {
        name: "graphiql-page.css",
        content_type: CSS,
        body: include_bytes!("../console/graphiql-page.css"),
    },
    Asset {
        name: "vendor/react.production.min.js",
        content_type: JS,
        body: include_bytes!("../vendor/react.production.min.js"),
    },
    Asset {
        name: "vendor/react-dom.production.min.js",
        content_type: JS,
        body: include_bytes!("../vendor/react-dom.production.min.js"),
    },
    Asset {
        name: "vendor/graphiql.min.js",
        content_type: JS,
        body: include_bytes!("../vendor/graphiql.min.js"),
    },
    Asset {
        name: "vendor/graphiql.min.css",
        content_type: CSS,
        body: include_bytes!("../vendor/graphiql.min.css"),
    },
];

const CONSOLE_PAGE: &[u8] = include_bytes!("../console/index.html");
const GRAPHIQL_PAGE: &[u8] = include_bytes!("../console/graphiql.html");

/// The console's routes; merged into the application router. (`GET /graphql` is GraphQL's
/// route, which answers with [`graphiql_page`].)
pub(crate) fn routes() -> Routes {
    Routes::new()
        .page(Method::GET, "/console", console_page)
        .page(Method::GET, "/console/", console_page)
        .page(Method::GET, "/console/{*file}", asset)
        .page(Method::GET, "/favicon.ico", favicon)
}

/// The headers every console and GraphiQL response carries.
fn guarded(content_type: &'static str, cache: &'static str, body: &'static [u8]) -> Response {
    let headers = [
        (CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (CACHE_CONTROL, HeaderValue::from_static(cache)),
        (
            HeaderName::from_static("content-security-policy"),
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            HeaderName::from_static("x-content-type-options"),
            HeaderValue::from_static("nosniff"),
        ),
        (
            HeaderName::from_static("x-frame-options"),
            HeaderValue::from_static("DENY"),
        ),
        (
            HeaderName::from_static("referrer-policy"),
            HeaderValue::from_static("no-referrer"),
        ),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            HeaderValue::from_static("same-origin"),
        ),
        (
            HeaderName::from_static("cross-origin-resource-policy"),
            HeaderValue::from_static("same-origin"),
        ),
    ];
    (headers, body).into_response()
}

async fn console_page() -> Response {
    guarded(HTML, "no-store", CONSOLE_PAGE)
}

/// `GET /graphql`: the GraphiQL page, loading only this binary's files.
pub(crate) fn graphiql_page() -> Response {
    guarded(HTML, "no-store", GRAPHIQL_PAGE)
}

async fn favicon() -> Response {
    asset(Path("favicon.svg".to_owned())).await
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == file) {
        // Files change only with the binary; a browser asks again each load (cheap on loopback).
        Some(a) => guarded(a.content_type, "no-cache", a.body),
        None => edge::error::ApiError::NotFound.into_response(),
    }
}

/// The names under `/console/` of every file served (for the offline test and the docs).
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|a| a.name)
}
