//! How long a sign-in must wait after failures, per account, per client address (an IPv6
//! address by its /64, see [`address_key`]) and per network (see [`network_key`]).
//!
//! The first few failures cost nothing (people mistype); after that each failure doubles the
//! wait before the next attempt is even checked, up to a cap. The account's cap is short
//! ([`ACCOUNT`]: 30 s), so someone guessing a real operator's password from many addresses can
//! only make that operator wait half a minute, never lock them out; an address's cap is longer
//! ([`ADDRESS`]: 5 min), since it only slows that one client. A browser the operator signed in
//! from before is counted by its device token instead ([`DEVICE`], see
//! [`sign_in_devices`](rebound_queue::store::Store::sign_in_device_operator)): guesses from
//! elsewhere, at the account or from a shared address, do not make it wait. Failures are forgotten after
//! [`FORGET_AFTER`] without one, and an account's after it signs in. The counts live in
//! Postgres (`login_failures`) so that every server process enforces the same waits.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::HeaderMap;
use rebound_queue::store::LoginFailures;

/// A key's rule: failures allowed before waits start, and the longest wait.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub free_failures: u32,
    pub max_wait: Duration,
}

/// Per account (the username typed, whether or not it exists).
pub const ACCOUNT: Rule = Rule { free_failures: 3, max_wait: Duration::from_secs(30) };
/// Per client address.
pub const ADDRESS: Rule = Rule { free_failures: 10, max_wait: Duration::from_secs(300) };
/// Per network: an IPv4 /24 or an IPv6 /48, what one party is commonly given or rents. It
/// bounds how many guesses someone holding many addresses (every /64 of a /48) gets before
/// each waits, where the per-address rule alone would give each address its own allowance.
pub const NETWORK: Rule = Rule { free_failures: 30, max_wait: Duration::from_secs(300) };
/// Per device token, for a browser its operator signed in from before. Its first failures are
/// free; at [`DEVICE_FAILURES`] the browser stops being known.
pub const DEVICE: Rule = Rule { free_failures: 3, max_wait: Duration::from_secs(60) };
/// Failures (without a success between them) after which a device is forgotten.
pub const DEVICE_FAILURES: u32 = 5;
/// Failures older than this (counted from the latest) are forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

impl Rule {
    /// The wait imposed after `failures` failures: 1 s after the first one past the free
    /// ones, doubling, capped.
    pub fn wait_after(&self, failures: u32) -> Duration {
        let Some(over) = failures.checked_sub(self.free_failures).filter(|n| *n > 0) else { return Duration::ZERO };
        let doubled = Duration::from_secs(1).saturating_mul(2u32.saturating_pow(over - 1));
        doubled.min(self.max_wait)
    }
}

/// The throttle keys of a sign-in attempt.
pub fn account_key(username: &str) -> String {
    format!("account:{}", username.trim().to_lowercase())
}

/// The throttle key of a sign-in from a known device, by the SHA-256 of its token.
pub fn device_key(token_hash: &str) -> String {
    format!("device:{token_hash}")
}

/// An IPv4 address counts alone; an IPv6 address counts with its whole /64, since one client
/// is usually given a /64 and could otherwise change address for every guess. An IPv4 address
/// written as IPv6 (`::ffff:10.1.2.3`, as a dual-stack socket reports it) is that IPv4 address.
pub fn address_key(address: Option<IpAddr>) -> String {
    match address.map(|a| a.to_canonical()) {
        None => "address:unknown".to_string(),
        Some(IpAddr::V4(v4)) => format!("address:{v4}"),
        Some(IpAddr::V6(v6)) => format!("address:{}/64", Ipv6Addr::from(u128::from(v6) & (u128::MAX << 64))),
    }
}

/// The network an address belongs to, counted beside the address: an IPv4 address's /24, an
/// IPv6 address's /48 (an IPv4 address written as IPv6 is IPv4). An unknown address has none.
pub fn network_key(address: Option<IpAddr>) -> Option<String> {
    match address?.to_canonical() {
        IpAddr::V4(v4) => Some(format!("network:{}/24", Ipv4Addr::from(u32::from(v4) & 0xffff_ff00))),
        IpAddr::V6(v6) => Some(format!("network:{}/48", Ipv6Addr::from(u128::from(v6) & (u128::MAX << 80)))),
    }
}

/// The client's address: the connection's peer, or behind a proxy the address the proxy
/// appended to `X-Forwarded-For` (the last one; earlier ones are whatever the client wrote).
pub fn client_address(headers: &HeaderMap, peer: Option<&ConnectInfo<SocketAddr>>, behind_proxy: bool) -> Option<IpAddr> {
    if behind_proxy
        && let Some(forwarded) = headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok()).next_back()
        && let Some(ip) = forwarded.rsplit(',').next().and_then(|a| a.trim().parse().ok())
    {
        return Some(ip);
    }
    peer.map(|c| c.0.ip())
}

/// How much longer the attempt must wait, given the keys' recent failures: the longest of
/// each key's wait minus the time since its latest failure.
pub fn remaining_wait(failures: &[LoginFailures]) -> Duration {
    failures
        .iter()
        .map(|f| {
            let rule = if f.key.starts_with("account:") {
                ACCOUNT
            } else if f.key.starts_with("device:") {
                DEVICE
            } else if f.key.starts_with("network:") {
                NETWORK
            } else {
                ADDRESS
            };
            rule.wait_after(f.failures).saturating_sub(f.since_last)
        })
        .max()
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_then_stop_growing() {
        let waits: Vec<u64> = (0..=12).map(|n| ACCOUNT.wait_after(n).as_secs()).collect();
        assert_eq!(waits, [0, 0, 0, 0, 1, 2, 4, 8, 16, 30, 30, 30, 30]);
        assert_eq!(ADDRESS.wait_after(10), Duration::ZERO);
        assert_eq!(ADDRESS.wait_after(11), Duration::from_secs(1));
        assert_eq!(ADDRESS.wait_after(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn the_longest_remaining_wait_counts() {
        let f = |key: &str, failures, since| LoginFailures { key: key.into(), failures, since_last: Duration::from_secs(since) };
        assert_eq!(remaining_wait(&[]), Duration::ZERO);
        assert_eq!(remaining_wait(&[f("account:olivia", 6, 1)]), Duration::from_secs(3));
        assert_eq!(remaining_wait(&[f("account:olivia", 6, 10), f("address:10.0.0.1", 14, 2)]), Duration::from_secs(6));
        assert_eq!(remaining_wait(&[f(&device_key("ab12"), 3, 0)]), Duration::ZERO, "a device has three free failures");
        assert_eq!(remaining_wait(&[f(&device_key("ab12"), 4, 0)]), Duration::from_secs(1));
        assert_eq!(remaining_wait(&[f(&device_key("ab12"), 99, 0)]), Duration::from_secs(60));
    }

    #[test]
    fn ipv6_addresses_count_by_their_64_and_mapped_ipv4_as_ipv4() {
        let key = |a: &str| address_key(Some(a.parse().expect("an address")));
        assert_eq!(key("10.1.2.3"), "address:10.1.2.3");
        assert_eq!(key("::ffff:10.1.2.3"), "address:10.1.2.3");
        assert_eq!(key("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "address:2001:db8:1:2::/64");
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_ne!(key("10.1.2.3"), key("10.1.2.4"));
        assert_eq!(key("::1"), "address:::/64");
        assert_eq!(address_key(None), "address:unknown");
    }

    #[test]
    fn networks_are_an_ipv4_24_and_an_ipv6_48() {
        let key = |a: &str| network_key(Some(a.parse().expect("an address")));
        assert_eq!(key("10.1.2.3").as_deref(), Some("network:10.1.2.0/24"));
        assert_eq!(key("::ffff:10.1.2.200").as_deref(), Some("network:10.1.2.0/24"));
        assert_eq!(key("2001:db8:1:2:aaaa::1").as_deref(), Some("network:2001:db8:1::/48"));
        assert_eq!(key("2001:db8:1:ffff::1"), key("2001:db8:1:2::1"), "every /64 of a /48");
        assert_ne!(key("2001:db8:2::1"), key("2001:db8:1::1"));
        assert_eq!(network_key(None), None);
        let f = |key: &str, failures| LoginFailures { key: key.into(), failures, since_last: Duration::ZERO };
        assert_eq!(remaining_wait(&[f("network:10.1.2.0/24", 30)]), Duration::ZERO);
        assert_eq!(remaining_wait(&[f("network:10.1.2.0/24", 31)]), Duration::from_secs(1));
    }

    #[test]
    fn the_proxy_appended_address_is_the_last() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "6.6.6.6, 10.1.2.3".parse().expect("header"));
        let peer = ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 9)));
        assert_eq!(client_address(&h, Some(&peer), true), Some(IpAddr::from([10, 1, 2, 3])));
        assert_eq!(client_address(&h, Some(&peer), false), Some(IpAddr::from([127, 0, 0, 1])));
    }
}
