//! Where a webhook may be sent: the endpoint's host is resolved and every address it
//! resolves to must be public, unless private addresses are allowed (development and
//! tests). Delivery connects to the address that was checked, so a DNS answer that
//! changes between the check and the connection cannot redirect it.

use reqwest::Url;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Why an endpoint may not be reached.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error("the URL must be http or https with a host")]
    NotHttp,
    /// The host does not resolve, or resolves to an address that is not public: one
    /// answer for both, since two would tell a caller which internal names exist.
    #[error(
        "the host does not resolve to a public address (webhooks may not reach loopback, private or link-local ones)"
    )]
    NotPublic,
}

/// Resolves the URL's host and returns the address to connect to.
pub async fn resolve(url: &Url, allow_private: bool) -> Result<SocketAddr, AddressError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(AddressError::NotHttp);
    }
    let host = url.host_str().ok_or(AddressError::NotHttp)?;
    let port = url.port_or_known_default().ok_or(AddressError::NotHttp)?;
    // `[::1]` comes with its brackets from the URL.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|_| AddressError::NotPublic)?
        .collect();
    let first = *addresses.first().ok_or(AddressError::NotPublic)?;
    if !allow_private && addresses.iter().any(|address| !is_public(address.ip())) {
        return Err(AddressError::NotPublic);
    }
    Ok(first)
}

/// Whether an address is on the public internet: not loopback, private, link-local,
/// shared (carrier NAT), unspecified, broadcast, multicast or documentation space —
/// also when an IPv4 address hides inside an IPv6 one.
pub fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(address: Ipv4Addr) -> bool {
    let [first, second, ..] = address.octets();
    let shared = first == 100 && (64..128).contains(&second);
    let this_network = first == 0;
    let reserved = first >= 240;
    // 198.18.0.0/15 (benchmarking, often routed inside a network) and 192.0.0.0/24
    // (protocol assignments).
    let benchmarking = first == 198 && (second & 0xfe) == 18;
    let protocol_assignments = address.octets()[..3] == [192, 0, 0];
    !(address.is_loopback()
        || address.is_private()
        || address.is_link_local()
        || address.is_unspecified()
        || address.is_broadcast()
        || address.is_multicast()
        || address.is_documentation()
        || shared
        || this_network
        || reserved
        || benchmarking
        || protocol_assignments)
}

fn is_public_v6(address: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(address) {
        return is_public_v4(v4);
    }
    let first = address.segments()[0];
    let unique_local = first & 0xfe00 == 0xfc00;
    let link_local = first & 0xffc0 == 0xfe80;
    let site_local = first & 0xffc0 == 0xfec0;
    let documentation = first == 0x2001 && address.segments()[1] == 0x0db8;
    // The local-use NAT64 prefix (RFC 8215) translates to addresses of the operator's
    // own network.
    let local_nat64 = first == 0x64 && address.segments()[1..3] == [0xff9b, 1];
    !(address.is_loopback()
        || address.is_unspecified()
        || address.is_multicast()
        || unique_local
        || link_local
        || site_local
        || documentation
        || local_nat64)
}

/// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`), IPv4-translated
/// (`::ffff:0:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`, and
/// the local-use `64:ff9b:1::/48`) or 6to4 (`2002:a.b.c.d::`) IPv6 address.
fn embedded_v4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = address.to_ipv4_mapped() {
        return Some(v4);
    }
    let segments = address.segments();
    let tail = || {
        let [.., a, b, c, d] = address.octets();
        Ipv4Addr::new(a, b, c, d)
    };
    let compatible = segments[..6].iter().all(|segment| *segment == 0)
        && !address.is_loopback()
        && !address.is_unspecified();
    let nat64 = segments[0] == 0x64 && segments[1] == 0xff9b && segments[2..6] == [0; 4];
    let translated = segments[..4] == [0; 4] && segments[4] == 0xffff && segments[5] == 0;
    if segments[0] == 0x2002 {
        let [_, _, a, b, c, d, ..] = address.octets();
        return Some(Ipv4Addr::new(a, b, c, d));
    }
    (compatible || nat64 || translated).then(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_loopback_and_link_local_addresses_are_refused_in_every_form() {
        for text in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "::ffff:0:127.0.0.1",
            "64:ff9b:1::7f00:1",
            "2002:7f00:1::",
            "198.18.0.1",
            "192.0.0.1",
        ] {
            let address: IpAddr = text.parse().unwrap();
            assert!(!is_public(address), "{text} counted as public");
        }
        for text in [
            "93.184.216.34",
            "2606:2800:220:1::1",
            "::ffff:93.184.216.34",
        ] {
            let address: IpAddr = text.parse().unwrap();
            assert!(is_public(address), "{text} counted as private");
        }
    }

    #[tokio::test]
    async fn a_loopback_url_resolves_only_when_private_addresses_are_allowed() {
        let url = Url::parse("http://localhost:9/hook").unwrap();
        assert!(matches!(
            resolve(&url, false).await,
            Err(AddressError::NotPublic)
        ));
        let address = resolve(&url, true).await.unwrap();
        assert!(address.ip().is_loopback());
        let ftp = Url::parse("ftp://example.com/").unwrap();
        assert!(matches!(
            resolve(&ftp, true).await,
            Err(AddressError::NotHttp)
        ));
    }
}
