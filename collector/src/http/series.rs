//! `/api/v1` time series for the dashboard's plots: the fleet's corrupting and at-risk GPUs
//! over time, and a node's failure rate per NIC by hour or day. Read-only, like every handler.

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::{AppState, params};
use crate::store::read::{self, Bucket, NicBucket, Period, StatusPoint};

type ApiResult<T> = Result<Json<T>, ApiError>;

/// `?since=&until=&points=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FleetSeriesQuery {
    /// RFC 3339 time, or a duration before now (90s, 15m, 2h, 30d; at most 3650 days back).
    /// Default (absent or empty) 1d.
    #[param(example = "1d", schema_with = params::time_schema)]
    since: Option<String>,
    /// RFC 3339 time, or a duration before now. Default (absent or empty) now.
    #[param(schema_with = params::time_schema)]
    until: Option<String>,
    /// Points, evenly spaced from `since` to `until` (2–240). Default (absent): 120.
    #[param(value_type = Option<u32>, minimum = 2, maximum = 240)]
    points: Option<String>,
}

/// `GET /api/v1/fleet/series`.
#[derive(Debug, Serialize, ToSchema)]
pub struct FleetSeries {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// Oldest first.
    pub points: Vec<StatusPoint>,
}

/// The fleet's corrupting and at-risk GPUs over time, from the status history.
#[utoipa::path(get, path = "/api/v1/fleet/series", tag = "history",
    params(FleetSeriesQuery),
    responses(
        (status = 200, description = "GPUs corrupting and at risk at evenly spaced moments", body = FleetSeries),
        (status = 400, description = "Bad time or point count", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ))]
pub async fn fleet_series(
    State(s): State<AppState>,
    params::ApiQuery(q): params::ApiQuery<FleetSeriesQuery>,
) -> ApiResult<FleetSeries> {
    let (since, until) = params::time_range(q.since.as_deref(), q.until.as_deref(), "1d")?;
    let points = params::count("points", q.points.as_deref(), 120, 2..=read::MAX_POINTS)?;
    let points =
        if since < until { read::fleet_status_series(&s.pool, since, until, points).await? } else { Vec::new() };
    Ok(Json(FleetSeries { since, until, points }))
}

/// `?since=&until=&bucket=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NicSeriesQuery {
    /// RFC 3339 time, or a duration before now (90s, 15m, 2h, 30d; at most 3650 days back).
    /// Default (absent or empty) 1d.
    #[param(example = "1d", schema_with = params::time_schema)]
    since: Option<String>,
    /// RFC 3339 time, or a duration before now. Default (absent or empty) now.
    #[param(schema_with = params::time_schema)]
    until: Option<String>,
    /// `hour` or `day`. Default (absent or empty): `hour` for periods up to 7 days, `day` beyond.
    #[param(example = "hour", pattern = "^(hour|day)?$")]
    bucket: Option<String>,
}

/// `GET /api/v1/nodes/{node}/nics/series`.
#[derive(Debug, Serialize, ToSchema)]
pub struct NicSeries {
    pub node: String,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub bucket: Bucket,
    /// Per NIC and bucket, oldest first: the probes of every GPU of the node through it.
    pub buckets: Vec<NicBucket>,
}

/// A node's probes per NIC and hour (or day), over all its GPUs: its NICs' failure rates over time.
#[utoipa::path(get, path = "/api/v1/nodes/{node}/nics/series", tag = "history",
    params(params::NodePath, NicSeriesQuery),
    responses(
        (status = 200, description = "Per NIC and bucket, oldest first", body = NicSeries),
        (status = 400, description = "Bad node id, time or bucket", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "Unknown node", body = ErrorBody),
    ))]
pub async fn nic_series(
    State(s): State<AppState>,
    Path(node): Path<String>,
    params::ApiQuery(q): params::ApiQuery<NicSeriesQuery>,
) -> ApiResult<NicSeries> {
    let node = params::node(&node)?;
    if read::node(&s.pool, node.as_str()).await?.is_none() {
        return Err(ApiError::NotFound(format!("no node \"{}\"", node.as_str())));
    }
    let (since, until) = params::time_range(q.since.as_deref(), q.until.as_deref(), "1d")?;
    let bucket = params::bucket(q.bucket.as_deref(), since, until)?;
    let period = Period { since, until, limit: 100_000 };
    let buckets = read::node_nic_series(&s.pool, node.as_str(), period, bucket).await?;
    Ok(Json(NicSeries { node: node.as_str().to_owned(), since, until, bucket, buckets }))
}
