//! Signing in to the dashboard with no token in any URL: `POST /signin` takes the API token from
//! a form and answers with a session cookie; the API then accepts the cookie where it accepts
//! `Authorization: Bearer` ([`authorized`]); `POST /signout` clears it.
//!
//! Constraints:
//! - The token is never in a URL, a log line or the cookie. The cookie holds an expiry and an
//!   HMAC-SHA256 of it keyed by the token (`v1.<expiry>.<mac>`): every replica that shares the
//!   token verifies it with no session store, a forged or altered cookie is refused, and a new
//!   token signs everyone out.
//! - The cookie is `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page
//!   sends it) and `Secure` whenever the listener is HTTPS; it lasts [`SESSION_TTL`].
//! - `/signin` and `/signout` refuse a form another site posts (`Sec-Fetch-Site`, else
//!   `Origin`), and send the browser on only to a path of this collector (`next`): never to
//!   another site.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Form;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::AppState;

/// The session cookie's name.
pub const COOKIE: &str = "railguard_session";
/// How long a sign-in lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The longest `next` path `/signin` sends the browser on to.
const MAX_NEXT: usize = 2048;

/// The sign-in form's fields.
#[derive(Debug, serde::Deserialize)]
pub struct SignIn {
    pub token: String,
    #[serde(default)]
    pub next: String,
}

fn mac(token: &str, expiry: u64) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token.as_bytes()).unwrap_or_else(|_| unreachable!());
    m.update(b"railguard-session-v1:");
    m.update(expiry.to_string().as_bytes());
    m
}

/// The cookie value of a session signed with `token`, ending at `expiry` (Unix seconds).
pub fn issue(token: &str, expiry: u64) -> String {
    let tag = mac(token, expiry).finalize().into_bytes();
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    format!("v1.{expiry}.{hex}")
}

/// Whether `value` is a session `token` signed that has not ended at `now` (Unix seconds).
pub fn verify(token: &str, value: &str, now: u64) -> bool {
    let mut parts = value.splitn(3, '.');
    let (Some("v1"), Some(expiry), Some(hex)) = (parts.next(), parts.next(), parts.next()) else { return false };
    let Ok(expiry) = expiry.parse::<u64>() else { return false };
    if expiry <= now || hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    let tag: Vec<u8> = (0..32).filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()).collect();
    mac(token, expiry).verify_slice(&tag).is_ok()
}

/// The session cookie's value among `headers`' cookies.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Whether `token` matches `want`, compared as digests: the time taken says nothing of either.
fn same_token(token: &str, want: &str) -> bool {
    Sha256::digest(token.as_bytes()) == Sha256::digest(want.as_bytes())
}

/// Whether `req` may read the API when `want` is its token: `Authorization: Bearer <token>`, or
/// a session cookie signed with it.
pub fn authorized(req: &Request, want: &str) -> bool {
    let bearer = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if bearer.and_then(|v| v.strip_prefix("Bearer ")).is_some_and(|t| same_token(t, want)) {
        return true;
    }
    cookie(req.headers()).is_some_and(|c| verify(want, c, now()))
}

/// Where `/signin` sends the browser on: `next` if it is a path of this collector, else `/`.
fn safe_next(next: &str) -> &str {
    let local = next.starts_with('/')
        && !next.starts_with("//")
        && !next.starts_with("/\\")
        && next.len() <= MAX_NEXT
        && !next.chars().any(|c| c.is_control() || c == '\\');
    if local { next } else { "/" }
}

/// Whether a form post comes from this collector's own page. A browser says where a request
/// comes from in `Sec-Fetch-Site` (sent whatever the referrer policy; the dashboard's,
/// `no-referrer`, makes its `Origin` `null`): only `same-origin` passes. A browser without it
/// sends `Origin`, which must name this host. A client that sends neither is no browser posting
/// another site's form.
fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return site.as_bytes() == b"same-origin";
    }
    let Some(origin) = headers.get(header::ORIGIN) else { return true };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin.to_str().ok().and_then(|o| o.split_once("://")).map(|(_, rest)| rest);
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

fn see_other(to: &str, cookie: Option<String>) -> Response {
    let mut resp = StatusCode::SEE_OTHER.into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(to) {
        h.insert(header::LOCATION, v);
    }
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        h.insert(header::SET_COOKIE, c);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn set_cookie(value: &str, max_age: u64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}")
}

/// `POST /signin`: the token from the form, a session cookie back, and on to `next`. A wrong
/// token goes back to the form, told so; nothing of it is logged.
pub async fn signin(State(s): State<AppState>, headers: HeaderMap, Form(form): Form<SignIn>) -> Response {
    if !same_origin(&headers) {
        return (StatusCode::FORBIDDEN, "a sign-in form from another site is refused").into_response();
    }
    let next = safe_next(&form.next);
    let Some(want) = s.api_token.as_deref() else {
        // No token configured: the dashboard is open; nothing to sign in to.
        return see_other(next, None);
    };
    if !same_token(&form.token, want) {
        tracing::info!("dashboard sign-in refused: wrong token");
        // Back to the form, on the page it came from (the dashboard's pages are the fragment).
        let fragment = next.split_once('#').map_or("", |(_, f)| f);
        let back =
            if fragment.is_empty() { "/?signin=failed".to_owned() } else { format!("/?signin=failed#{fragment}") };
        return see_other(&back, None);
    }
    let expiry = now().saturating_add(SESSION_TTL.as_secs());
    see_other(next, Some(set_cookie(&issue(want, expiry), SESSION_TTL.as_secs(), s.secure_cookies)))
}

/// `POST /signout`: the session cookie cleared.
pub async fn signout(State(s): State<AppState>, headers: HeaderMap) -> Response {
    if !same_origin(&headers) {
        return (StatusCode::FORBIDDEN, "a sign-out form from another site is refused").into_response();
    }
    see_other("/", Some(set_cookie("", 0, s.secure_cookies)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_holds_for_its_token_until_it_ends_and_nothing_else_passes() {
        let v = issue("reader-token-0123456789", 2_000);
        assert!(!v.contains("reader-token"), "the cookie never holds the token: {v}");
        assert!(verify("reader-token-0123456789", &v, 1_999));
        assert!(!verify("reader-token-0123456789", &v, 2_000), "ended");
        assert!(!verify("another-token-0123456789", &v, 1_000), "a new token signs everyone out");
        let later = v.replacen("v1.2000.", "v1.9000.", 1);
        assert!(!verify("reader-token-0123456789", &later, 1_000), "an extended expiry is refused");
        for bad in ["", "v1", "v1.x.y", "v2.2000.00", "v1.2000.zz", "v1.2000.", &format!("{v}0")] {
            assert!(!verify("reader-token-0123456789", bad, 1_000), "{bad:?}");
        }
    }

    #[test]
    fn signin_sends_the_browser_on_only_within_this_collector() {
        assert_eq!(safe_next("/?node=gpu-node-7&gpu=3"), "/?node=gpu-node-7&gpu=3");
        for away in ["https://evil.example/", "//evil.example/", "/\\evil.example", "evil", "/a\nb", ""] {
            assert_eq!(safe_next(away), "/", "{away:?}");
        }
        assert_eq!(safe_next(&format!("/{}", "a".repeat(MAX_NEXT))), "/");
    }

    #[test]
    fn a_form_from_another_site_is_told_apart() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:9090"));
        assert!(same_origin(&h), "no Origin: not a cross-site browser post");
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:9090"));
        assert!(same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("https://evil.example"));
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
        // A browser's own word, whatever its Origin says.
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(same_origin(&h), "the dashboard's own form (no-referrer: Origin null)");
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:9090"));
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!same_origin(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-site"));
        assert!(!same_origin(&h), "a sibling subdomain is another site's page");
    }

    #[test]
    fn the_cookie_is_read_among_others() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_static("a=1; railguard_session=v1.5.ab; b=2"));
        assert_eq!(cookie(&h), Some("v1.5.ab"));
        h.insert(header::COOKIE, HeaderValue::from_static("railguard_sessionx=1"));
        assert_eq!(cookie(&h), None);
    }
}
