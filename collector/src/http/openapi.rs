//! The API's OpenAPI 3.1 document, generated from the handlers' annotations and the read
//! layer's row types (utoipa), served at `/api/v1/openapi.json`. A test validates live
//! responses against it, so the document cannot drift from what the API returns.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{api, series};

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "railguard collector API",
        version = "1",
        description = "Read-only. Per-GPU status (ok, watch, unknown, at_risk, corrupting) with the evidence behind it, and \
            the history of probes, signals and status changes. When the collector runs with --api-token-file, every \
            /api/v1 call except this document needs `Authorization: Bearer <token>`. Errors are JSON \
            (`{\"error\": \"...\"}`): 400 for a bad parameter, 404 for an unknown node or GPU, 401 for a missing \
            or wrong token."
    ),
    paths(
        api::info,
        api::fleet,
        api::node,
        api::gpu,
        api::gpus,
        api::history,
        api::failures,
        api::engines,
        api::sources,
        api::patterns,
        api::grid,
        series::fleet_series,
        series::nic_series
    ),
    modifiers(&BearerAuth),
    security((), ("bearer" = [])),
    tags(
        (name = "fleet", description = "The fleet at a glance"),
        (name = "nodes", description = "One node or GPU, with its evidence"),
        (name = "history", description = "What happened over time"),
        (name = "engines", description = "Findings on the serving engines and on the other end of transfers, fleet-wide (never a GPU's)"),
    )
)]
pub struct ApiDoc;

/// The optional bearer token of `--api-token-file`.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document as JSON.
pub fn document() -> String {
    ApiDoc::openapi().to_pretty_json().unwrap_or_else(|e| format!("{{\"error\": \"OpenAPI document: {e}\"}}"))
}
