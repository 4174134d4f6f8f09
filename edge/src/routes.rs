//! The route table: the one place a route is added, so the routes the server answers and the
//! routes the OpenAPI document names can be compared.
//!
//! axum's `Router` cannot list its routes, so each side builds its routes as a [`Routes`]: every
//! `(method, path)` it adds goes both into the axum router and into a list. A REST route is
//! added with [`Routes::api`] and must be in the OpenAPI document; the binary's test
//! (`ledger::api_doc`) checks that the list of API routes and the document's operations are the
//! same set, both ways, so a route added here and forgotten in the document (or documented and
//! not served) fails the build's tests. Pages that are not REST (the console, GraphQL,
//! `/metrics`) are added with [`Routes::page`] or [`Routes::pages`]; the test refuses a page
//! under `/api/`. The method is given once and the axum method router is made from it
//! ([`axum::routing::on`]), so the list cannot name a method the router does not answer.
//! The one way round the list is [`Routes::pages`], which takes a finished router and the
//! routes it serves on the caller's word (the GraphQL router, whose schema layer is its own).

use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{on, MethodFilter};
use axum::Router;

use crate::state::AppState;

/// What a route is: a REST route of the OpenAPI document, or a page outside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Api,
    Page,
}

/// One route as listed: its method, its path (axum's syntax, `{name}` for a parameter, which is
/// also OpenAPI's) and its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub kind: Kind,
}

/// An axum router together with the list of the routes it serves.
#[derive(Default)]
pub struct Routes {
    router: Router<AppState>,
    listed: Vec<Route>,
}

impl Routes {
    pub fn new() -> Self {
        Self::default()
    }

    /// A REST route: it must be in the OpenAPI document.
    pub fn api<H, T>(self, method: Method, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        self.add(Kind::Api, method, path, handler)
    }

    /// A page outside the REST document (HTML, GraphQL, Prometheus text).
    pub fn page<H, T>(self, method: Method, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        self.add(Kind::Page, method, path, handler)
    }

    /// A finished router of pages, with the routes it serves: listed on the caller's word, so
    /// only for a router that cannot be built here (it carries layers of its own).
    pub fn pages(mut self, router: Router<AppState>, served: &[(Method, &'static str)]) -> Self {
        self.router = self.router.merge(router);
        self.listed
            .extend(served.iter().map(|(method, path)| Route {
                method: method.clone(),
                path,
                kind: Kind::Page,
            }));
        self
    }

    /// Both tables' routes together.
    pub fn merge(mut self, other: Routes) -> Self {
        self.router = self.router.merge(other.router);
        self.listed.extend(other.listed);
        self
    }

    /// A layer around every route added so far (as `Router::layer`).
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
        L::Service: tower::Service<axum::extract::Request> + Clone + Send + Sync + 'static,
        <L::Service as tower::Service<axum::extract::Request>>::Response:
            axum::response::IntoResponse + 'static,
        <L::Service as tower::Service<axum::extract::Request>>::Error:
            Into<std::convert::Infallible> + 'static,
        <L::Service as tower::Service<axum::extract::Request>>::Future: Send + 'static,
    {
        self.router = self.router.layer(layer);
        self
    }

    /// Every route listed, in the order added.
    pub fn listed(&self) -> &[Route] {
        &self.listed
    }

    /// The axum router.
    pub fn into_router(self) -> Router<AppState> {
        self.router
    }

    fn add<H, T>(mut self, kind: Kind, method: Method, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone())
            .unwrap_or_else(|_| panic!("no method filter for {method}"));
        self.router = self.router.route(path, on(filter, handler));
        self.listed.push(Route { method, path, kind });
        self
    }
}
