//! The edge's fixed limits, which the server, the command bodies and GraphQL's websocket share.

/// The largest request body accepted; larger ones are answered 413.
pub const BODY_BYTES_MAX: usize = 16 * 1024;

/// The bulk route's path: its body limit is its own, so the up-front `Content-Length` check
/// (`http_server::request_limits`) lets it through.
pub const BULK_TRANSFERS_PATH: &str = "/api/v1/internal_transfers";
