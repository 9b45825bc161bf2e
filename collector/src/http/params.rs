//! Parsing of query parameters: times (RFC 3339 or relative like `30d`), node ids, statuses.

use chrono::{DateTime, Duration, Utc};
use railguard_schema::NodeId;

use super::error::ApiError;
use crate::assess::GpuStatus;

/// What `since`/`until` accept besides RFC 3339: a whole number (up to 9 digits) and a unit.
/// Empty is allowed: it means the parameter's default.
pub const DURATION_PATTERN: &str = "^([0-9]{1,9}[smhd])?$";

/// The longest duration back: longer ones mean this (more than any retention).
pub const MAX_DURATION_DAYS: i64 = 3650;

/// `since`/`until` in the OpenAPI document: an RFC 3339 date-time, or a duration.
pub fn time_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{AnyOfBuilder, KnownFormat, ObjectBuilder, SchemaFormat, Type};
    AnyOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime))),
        )
        .item(ObjectBuilder::new().schema_type(Type::String).pattern(Some(DURATION_PATTERN)))
        .into()
}

/// A query parameter given empty (`?since=`) is the same as absent: its default applies.
pub fn present(s: Option<&str>) -> Option<&str> {
    s.filter(|v| !v.is_empty())
}

/// The query string, deserialized; a query that does not fit (a repeated parameter, say) is the
/// API's JSON 400, not axum's plain-text rejection.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(e) => Err(ApiError::BadRequest(e.body_text())),
        }
    }
}

/// `2026-11-01T00:00:00Z`, or a duration before now: `90s`, `15m`, `2h`, `30d` (longer than
/// [`MAX_DURATION_DAYS`] means that many days).
pub fn parse_time(name: &str, s: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, ApiError> {
    let bad = || {
        ApiError::BadRequest(format!(
            "{name}={s:?}: expected RFC 3339 (2026-11-01T00:00:00Z) or a duration like 30d, 2h, 15m"
        ))
    };
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    // The unit is the last character (which may be any character, multi-byte included).
    let unit_at = s.char_indices().last().map_or(0, |(i, _)| i);
    let (num, unit) = s.split_at(unit_at);
    if num.is_empty() || num.len() > 9 || !num.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: i64 = num.parse().map_err(|_| bad())?;
    let d = match unit {
        "s" => Duration::seconds(n),
        "m" => Duration::minutes(n),
        "h" => Duration::hours(n),
        "d" => Duration::days(n),
        _ => return Err(bad()),
    };
    Ok(now - d.min(Duration::days(MAX_DURATION_DAYS)))
}

/// A `since`/`until` pair: defaults `default_since` ago and now. A `since` after `until` is
/// an empty period (every query over it finds nothing), not an error.
pub fn time_range(
    since: Option<&str>,
    until: Option<&str>,
    default_since: &str,
) -> Result<(DateTime<Utc>, DateTime<Utc>), ApiError> {
    let now = Utc::now();
    let since = parse_time("since", present(since).unwrap_or(default_since), now)?;
    let until = match present(until) {
        Some(u) => parse_time("until", u, now)?,
        None => now,
    };
    Ok((since, until))
}

pub fn node(s: &str) -> Result<NodeId, ApiError> {
    NodeId::new(s).map_err(|e| ApiError::BadRequest(format!("node: {e}")))
}

pub fn gpu(s: &str) -> Result<i32, ApiError> {
    s.parse::<u16>().map(i32::from).map_err(|_| ApiError::BadRequest(format!("gpu {s:?} is not a GPU index (0-65535)")))
}

/// `corrupting,at_risk` → statuses.
pub fn statuses(s: &str) -> Result<Vec<GpuStatus>, ApiError> {
    s.split(',')
        .map(|x| {
            GpuStatus::parse(x.trim()).ok_or_else(|| {
                ApiError::BadRequest(format!("status {x:?} is not one of ok, watch, unknown, at_risk, corrupting"))
            })
        })
        .collect()
}

/// The grid's filters (`q`, `status`, `nic`, `hv`, `model`; empty: none), each checked against
/// the pattern the OpenAPI document gives it.
pub fn grid_filter(
    q: Option<&str>,
    status: Option<&str>,
    nic: Option<&str>,
    hv: Option<&str>,
    model: Option<&str>,
) -> Result<crate::store::read::GridFilter, ApiError> {
    use crate::store::read::{GridFilter, HypervisorFilter, StatusFilter};
    let text = |name: &str, v: Option<&str>, max: usize, extra: &str| -> Result<Option<String>, ApiError> {
        let Some(v) = present(v) else { return Ok(None) };
        let fits =
            v.len() <= max && v.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c) || extra.contains(c));
        if !fits {
            let more = if extra.is_empty() { String::new() } else { format!(" or {extra:?}") };
            return Err(ApiError::BadRequest(format!(
                "{name}: at most {max} letters, digits, '.', '_', '-'{more}; {v:?} is not"
            )));
        }
        Ok(Some(v.to_owned()))
    };
    let status = match present(status) {
        None => None,
        Some("unverified") => Some(StatusFilter::Unverified),
        Some(s) => Some(StatusFilter::Is(GpuStatus::parse(s).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "status {s:?} is not one of ok, watch, unknown, at_risk, corrupting, unverified"
            ))
        })?)),
    };
    let hypervisor = text("hv", hv, 64, " ")?.map(|h| {
        if h.eq_ignore_ascii_case("none") { HypervisorFilter::BareMetal } else { HypervisorFilter::Contains(h) }
    });
    Ok(GridFilter {
        node: text("q", q, 128, "")?,
        status,
        nic: text("nic", nic, 64, ":")?,
        hypervisor,
        model: text("model", model, 64, " ")?,
    })
}

/// `limit`: 1–10000, `default` when absent.
pub fn limit(s: Option<&str>, default: u32) -> Result<i64, ApiError> {
    count("limit", s, default, 1..=10_000)
}

/// A whole number parameter `name` within `range`; `default` when absent. Documented as an
/// integer: an empty value is not one (unlike since/until/status).
pub fn count(name: &str, s: Option<&str>, default: u32, range: std::ops::RangeInclusive<u32>) -> Result<i64, ApiError> {
    let n = match s {
        None => default,
        Some(s) => {
            s.trim().parse::<u32>().map_err(|_| ApiError::BadRequest(format!("{name} {s:?} is not a whole number")))?
        }
    };
    if n < *range.start() {
        return Err(ApiError::BadRequest(format!("{name} must be at least {}", range.start())));
    }
    if n > *range.end() {
        return Err(ApiError::BadRequest(format!("{name} must be at most {}", range.end())));
    }
    Ok(i64::from(n))
}

/// `bucket=hour|day` of a GPU's history; absent or empty: by the period's length.
pub fn bucket(
    s: Option<&str>,
    since: chrono::DateTime<chrono::Utc>,
    until: chrono::DateTime<chrono::Utc>,
) -> Result<crate::store::read::Bucket, ApiError> {
    use crate::store::read::Bucket;
    match s {
        None | Some("") => Ok(Bucket::for_period(since, until)),
        Some("hour") => Ok(Bucket::Hour),
        Some("day") => Ok(Bucket::Day),
        Some(other) => Err(ApiError::BadRequest(format!(
            "bucket {:?} is not hour or day",
            other.chars().take(64).collect::<String>()
        ))),
    }
}

/// The `{node}` path parameter (documentation only: handlers take the text and check it).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct NodePath {
    /// Node id: letters, digits, `.`, `_`, `-`; 1–128 characters.
    #[param(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub node: String,
}

/// The `{gpu}` path parameter: the GPU's index on its node (nvidia-smi's numbering).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct GpuPath {
    /// GPU index, 0–65535.
    #[param(minimum = 0, maximum = 65535)]
    pub gpu: u16,
}

/// A fleet page cursor, `rank|node` as `/api/v1/fleet` returns it in `next`.
pub fn fleet_cursor(s: &str) -> Result<(i32, String), ApiError> {
    let bad = || ApiError::BadRequest(format!("after {s:?} is not a cursor from a previous page's `next`"));
    let (rank, node) = s.split_once('|').ok_or_else(bad)?;
    let rank: i32 = rank.parse().ok().filter(|r| (0..=8).contains(r)).ok_or_else(bad)?;
    let node = NodeId::new(node).map_err(|_| bad())?;
    Ok((rank, node.as_str().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10,000+ generated values for each parameter: random text (multi-byte, control
    /// characters) and near-misses of valid values. Nothing panics; every refusal is a 400 that
    /// names the parameter; every accepted duration is within the documented bound.
    #[test]
    fn generated_parameters_never_panic_and_refusals_name_the_parameter() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let now = Utc::now();
        let alphabet: Vec<char> = "0123456789smhdwT:-+Z.,_ é日\u{0}\u{7f}abcxyz".chars().collect();
        let near = ["30d", "2h", "2026-11-01T00:00:00Z", "corrupting,at_risk", "1000", "gpu-node-07", "7"];
        let mut text = || -> String {
            if rng.random_bool(0.5) {
                let mut s: Vec<char> = near[rng.random_range(0..near.len())].chars().collect();
                for _ in 0..rng.random_range(1..4) {
                    let i = rng.random_range(0..=s.len());
                    if rng.random_bool(0.5) && i < s.len() {
                        s.remove(i);
                    } else {
                        s.insert(i, alphabet[rng.random_range(0..alphabet.len())]);
                    }
                }
                s.into_iter().collect()
            } else {
                (0..rng.random_range(0..24)).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect()
            }
        };
        let bad = |r: Result<(), ApiError>, name: &str, v: &str| match r {
            Ok(()) => {}
            Err(ApiError::BadRequest(m)) => assert!(m.contains(name), "{name}={v:?}: {m}"),
            Err(e) => panic!("{name}={v:?}: not a 400: {e:?}"),
        };
        for _ in 0..10_000 {
            let v = text();
            bad(
                parse_time("since", &v, now).map(|t| {
                    assert!(t <= now && t >= now - Duration::days(MAX_DURATION_DAYS) || v.contains('T'), "{v:?} → {t}");
                }),
                "since",
                &v,
            );
            bad(statuses(&v).map(drop), "status", &v);
            bad(limit(Some(&v), 1000).map(|n| assert!((1..=10_000).contains(&n))), "limit", &v);
            bad(node(&v).map(drop), "node", &v);
            bad(gpu(&v).map(drop), "gpu", &v);
        }
    }

    #[test]
    fn times_parse_or_say_why_not() {
        let now = Utc::now();
        assert_eq!(parse_time("since", "2h", now).unwrap(), now - Duration::hours(2));
        assert!(parse_time("since", "2026-11-01T00:00:00Z", now).is_ok());
        for bad in ["", "yesterday", "-5d", "+5d", "5w", "9999999999d", "2026-13-01", "1é", "é", "5日"] {
            assert!(matches!(parse_time("since", bad, now), Err(ApiError::BadRequest(_))), "{bad:?}");
        }
        // Every duration the document allows parses; very long ones mean MAX_DURATION_DAYS.
        assert_eq!(parse_time("since", "999999999d", now).unwrap(), now - Duration::days(MAX_DURATION_DAYS));
        assert_eq!(parse_time("since", "0s", now).unwrap(), now);
        // Empty is absent: the default applies.
        assert!(time_range(Some(""), Some(""), "1d").is_ok());
        let (since, until) = time_range(Some("1h"), Some("2h"), "1d").unwrap();
        assert!(since > until, "since after until: an empty period, as given");
        assert!(statuses("corrupting,at_risk").is_ok());
        assert!(statuses("broken").is_err());
        assert!(gpu("-1").is_err() && gpu("x").is_err() && gpu("7").is_ok());
        assert_eq!(limit(None, 1000).unwrap(), 1000);
        assert_eq!(limit(Some("20"), 1000).unwrap(), 20);
        for bad in ["0", "10001", "x", "-1", "1.5", ""] {
            assert!(matches!(limit(Some(bad), 1000), Err(ApiError::BadRequest(_))), "{bad:?}");
        }
    }
}
