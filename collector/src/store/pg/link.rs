//! How the collector's link to Postgres is protected: TLS is verified only with
//! `sslmode=verify-full` (or `verify-ca`) and a root (`sslrootcert`); a link off the machine
//! without it carries the password and every record where others can read or change them.

use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// What is wrong with the link `opts` describes, for a warning at start; None when it stays on
/// this machine (a Unix socket, loopback) or is verified TLS.
pub fn unverified_link(opts: &PgConnectOptions) -> Option<String> {
    let host = opts.get_host();
    let local = opts.get_socket().is_some()
        || host.starts_with('/')
        || host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let verified = matches!(opts.get_ssl_mode(), PgSslMode::VerifyFull | PgSslMode::VerifyCa);
    (!local && !verified).then(|| {
        format!(
            "the link to Postgres at {host}:{} is not verified TLS (sslmode={}): add \
             sslmode=verify-full&sslrootcert=<the server's CA> to the URL",
            opts.get_port(),
            match opts.get_ssl_mode() {
                PgSslMode::Disable => "disable",
                PgSslMode::Allow => "allow",
                PgSslMode::Prefer => "prefer",
                PgSslMode::Require => "require",
                PgSslMode::VerifyCa => "verify-ca",
                PgSslMode::VerifyFull => "verify-full",
            }
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_a_remote_link_without_verified_tls_is_said() {
        let said = |url: &str| unverified_link(&url.parse().unwrap());
        assert!(said("postgresql://rg@db.example:5432/railguard").unwrap().contains("sslmode=prefer"));
        assert!(said("postgresql://rg@10.0.0.5/railguard?sslmode=require").unwrap().contains("sslmode=require"));
        assert_eq!(said("postgresql://rg@db.example/railguard?sslmode=verify-full"), None);
        assert_eq!(said("postgresql://rg@127.0.0.1:25430/railguard"), None);
        assert_eq!(said("postgresql://rg@[::1]:25430/railguard"), None);
        assert_eq!(said("postgresql:///railguard?host=/var/run/postgresql"), None);
    }
}
