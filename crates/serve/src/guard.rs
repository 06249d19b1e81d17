//! The server's safety checks: which Host names a loopback server answers (a DNS-rebinding
//! page names its own), which browser origins may change state (only the server's own), and the
//! API key, compared in time that does not depend on where it differs.

/// Whether `host` (a `Host` header: a name or address, with an optional port) names this
/// machine's loopback: `localhost` (or a name under it), `127.x.y.z`, `[::1]`.
pub fn is_loopback_host(host: &str) -> bool {
    let name = strip_port(host).to_ascii_lowercase();
    let name = name.trim_end_matches('.');
    if name == "localhost" || name.ends_with(".localhost") || name == "[::1]" {
        return true;
    }
    name.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|a| a.is_loopback())
}

/// `host` without its port (`[::1]:8080` → `[::1]`, `h:80` → `h`).
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether a request that changes state may go on, by its browser headers: no `Origin` (not a
/// browser's cross-site request: curl, an SDK) or the server's own (`http://` + the request's
/// `Host`), and no `Sec-Fetch-Site: cross-site`.
pub fn origin_allowed(origin: Option<&str>, host: Option<&str>, fetch_site: Option<&str>) -> bool {
    if fetch_site.is_some_and(|s| s.eq_ignore_ascii_case("cross-site")) {
        return false;
    }
    match origin {
        None => true,
        Some(o) => host.is_some_and(|h| {
            o.strip_prefix("http://")
                .is_some_and(|rest| rest.eq_ignore_ascii_case(h))
        }),
    }
}

/// `a == b`, in a time that depends on the lengths only (not on where the bytes differ).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The key of an `Authorization: Bearer <key>` header.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let a = authorization?.trim();
    let (scheme, key) = a.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_pass_and_others_do_not() {
        for h in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.",
            "app.localhost:1",
            "127.0.0.1",
            "127.8.9.10:80",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "128.0.0.1",
            "10.0.0.1:80",
            "[::2]:80",
            "",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn only_the_own_origin_changes_state() {
        let host = Some("127.0.0.1:8080");
        assert!(origin_allowed(None, host, None));
        assert!(origin_allowed(Some("http://127.0.0.1:8080"), host, None));
        assert!(origin_allowed(
            Some("http://127.0.0.1:8080"),
            host,
            Some("same-origin")
        ));
        assert!(!origin_allowed(Some("http://evil.example"), host, None));
        assert!(!origin_allowed(Some("null"), host, None));
        assert!(!origin_allowed(Some("https://127.0.0.1:8080"), host, None));
        assert!(!origin_allowed(Some("http://127.0.0.1:8081"), host, None));
        assert!(!origin_allowed(Some("http://127.0.0.1:8080"), None, None));
        assert!(!origin_allowed(None, host, Some("cross-site")));
    }

    #[test]
    fn keys_compare_whole() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"Secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secret2"));
        assert!(!ct_eq(b"", b"x"));
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(None), None);
    }
}
