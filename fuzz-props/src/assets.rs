//! The asset table every spot-core target decodes against (the built-in one), made once.

use std::sync::OnceLock;

use spot_core::assets::Assets;

/// The built-in asset table, shared by the protocol, WAL and snapshot targets.
pub(crate) fn assets() -> Assets {
    static ASSETS: OnceLock<Assets> = OnceLock::new();
    ASSETS.get_or_init(Assets::builtin).clone()
}
