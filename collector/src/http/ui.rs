//! The dashboard's assets (`web/`), compiled into the binary: nothing is fetched from the
//! internet at run time, and the dashboard works wherever the collector runs.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../../../web/index.html");
const APP: &str = include_str!("../../../web/app.js");
const STYLE: &str = include_str!("../../../web/style.css");
const CHARTS: &str = include_str!("../../../web/charts.js");
// uPlot (MIT, web/vendor/uPlot.LICENSE): the plots' drawing library, shipped with the collector.
const UPLOT_JS: &str = include_str!("../../../web/vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../../web/vendor/uPlot.min.css");

pub async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response()
}

pub async fn asset(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "app.js" => ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], APP).into_response(),
        "style.css" => ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response(),
        "charts.js" => ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], CHARTS).into_response(),
        "uPlot.iife.min.js" => ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], UPLOT_JS).into_response(),
        "uPlot.min.css" => ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], UPLOT_CSS).into_response(),
        _ => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}
