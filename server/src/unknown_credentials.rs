//! Look-ups of credentials that turn out unknown, counted per client address.
//!
//! A bearer token or a session cookie of the right shape can only be told from a live one by
//! looking it up, and that look-up comes before any per-caller limit (the caller is what it
//! establishes). So an address that keeps sending unknown credentials is stopped looking:
//! past [`UNKNOWN_PER_WINDOW`] unknown ones in a [`WINDOW`], its credentials are not looked up
//! until the window ends (the API answers 429, the dashboard treats the request as signed
//! out). Known credentials never count: a client with a live token is held back only while
//! its address (an IPv6 client's whole /64, as for sign-ins) is also sending unknown ones.
//! The counts live in this process, like the request limits.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many unknown credentials an address may send in one [`WINDOW`].
pub const UNKNOWN_PER_WINDOW: u32 = 20;

/// The window unknown credentials are counted in.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Past this many addresses, ended windows are forgotten; if none has ended, a new address
/// is not counted (its look-ups go on as before) rather than the map growing without bound.
const MAX_ADDRESSES: usize = 10_000;

/// Each address's window: when it started and how many unknown credentials it has seen.
#[derive(Debug, Default)]
pub struct UnknownCredentials {
    windows: Mutex<HashMap<String, (Instant, u32)>>,
}

impl UnknownCredentials {
    /// How long `address` must wait before a credential it sends is looked up again; `None`
    /// if it may be looked up now.
    pub fn wait(&self, address: &str) -> Option<Duration> {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let (started, unknown) = windows.get(address)?;
        let left = WINDOW.checked_sub(started.elapsed())?;
        (*unknown >= UNKNOWN_PER_WINDOW && !left.is_zero()).then_some(left)
    }

    /// Counts a credential from `address` that was looked up and found unknown.
    pub fn unknown(&self, address: &str) {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if !windows.contains_key(address) && windows.len() >= MAX_ADDRESSES {
            windows.retain(|_, (started, _)| started.elapsed() < WINDOW);
            if windows.len() >= MAX_ADDRESSES {
                return;
            }
        }
        let window = windows.entry(address.to_owned()).or_insert((Instant::now(), 0));
        if window.0.elapsed() >= WINDOW {
            *window = (Instant::now(), 0);
        }
        window.1 = window.1.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_past_its_unknown_credentials_waits_out_the_window_and_others_do_not() {
        let seen = UnknownCredentials::default();
        for _ in 0..UNKNOWN_PER_WINDOW - 1 {
            seen.unknown("address:192.0.2.1");
        }
        assert_eq!(seen.wait("address:192.0.2.1"), None, "still under the limit");
        seen.unknown("address:192.0.2.1");
        let wait = seen.wait("address:192.0.2.1").expect("at the limit");
        assert!(wait > WINDOW - Duration::from_secs(5) && wait <= WINDOW, "{wait:?}");
        assert_eq!(seen.wait("address:192.0.2.2"), None, "another address is not held back");

        // A window that has ended counts afresh.
        seen.windows.lock().expect("lock").insert("address:192.0.2.1".into(), (Instant::now().checked_sub(WINDOW).expect("up for longer than the window"), UNKNOWN_PER_WINDOW));
        assert_eq!(seen.wait("address:192.0.2.1"), None);
        seen.unknown("address:192.0.2.1");
        assert_eq!(seen.windows.lock().expect("lock")["address:192.0.2.1"].1, 1);
    }

    #[test]
    fn the_addresses_counted_are_bounded() {
        let seen = UnknownCredentials::default();
        for i in 0..MAX_ADDRESSES + 10 {
            seen.unknown(&format!("address:{i}"));
        }
        assert_eq!(seen.windows.lock().expect("lock").len(), MAX_ADDRESSES);
        // Once their windows have ended, the old ones make room for new ones.
        for w in seen.windows.lock().expect("lock").values_mut() {
            w.0 = Instant::now().checked_sub(WINDOW).expect("up for longer than the window");
        }
        seen.unknown("address:new");
        assert_eq!(seen.windows.lock().expect("lock").len(), 1);
    }
}
