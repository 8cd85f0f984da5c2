//! Look-ups of credentials that turn out unknown, counted per client address.
//!
//! A bearer token or a session cookie of the right shape can only be told from a live one by
//! looking it up, and that look-up comes before any per-caller limit (the caller is what it
//! establishes). So an address that keeps sending unknown credentials is stopped looking:
//! past [`UNKNOWN_PER_WINDOW`] unknown ones in a [`WINDOW`], what it sends is not looked up
//! until the window ends (the API answers 429, the dashboard treats the request as signed
//! out). The API and the dashboard count apart (callers prefix the address), and a
//! credential found live within [`LIVE_FOR`] is always looked up: a client sharing an address
//! (a NAT, a cluster's egress) with a guesser or with stale browser tabs is not held back.
//! The counts live in this process, like the request limits.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many unknown credentials an address may send in one [`WINDOW`].
pub const UNKNOWN_PER_WINDOW: u32 = 20;

/// The window unknown credentials are counted in.
pub const WINDOW: Duration = Duration::from_secs(10);

/// How long a credential found live is looked up whatever its address has sent.
pub const LIVE_FOR: Duration = Duration::from_secs(600);

/// Past this many entries, a map forgets the expired ones (at most once per window, so a
/// flood of new addresses cannot make every request scan it); until then, new entries are not
/// recorded rather than the map growing without bound.
const MAX_ENTRIES: usize = 10_000;

/// Entries with the time they were last (re)started, pruned at most once per `every`.
#[derive(Debug, Default)]
struct Bounded<V> {
    entries: HashMap<String, (Instant, V)>,
    pruned_at: Option<Instant>,
}

impl<V> Bounded<V> {
    /// Room for `key`: true if it is there or could be added.
    fn room_for(&mut self, key: &str, lasts: Duration) -> bool {
        if self.entries.len() < MAX_ENTRIES || self.entries.contains_key(key) {
            return true;
        }
        if self.pruned_at.is_none_or(|at| at.elapsed() >= WINDOW) {
            self.pruned_at = Some(Instant::now());
            self.entries.retain(|_, (at, _)| at.elapsed() < lasts);
        }
        self.entries.len() < MAX_ENTRIES
    }
}

/// Each address's window of unknown credentials, and the credentials lately found live.
#[derive(Debug, Default)]
pub struct UnknownCredentials {
    windows: Mutex<Bounded<u32>>,
    live: Mutex<Bounded<()>>,
}

impl UnknownCredentials {
    /// How long `address` must wait before `credential` (its hash) is looked up; `None` if it
    /// may be looked up now.
    pub fn wait(&self, address: &str, credential: &str) -> Option<Duration> {
        {
            let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            if live.entries.get(credential).is_some_and(|(at, ())| at.elapsed() < LIVE_FOR) {
                return None;
            }
        }
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let (started, unknown) = windows.entries.get(address)?;
        let left = WINDOW.checked_sub(started.elapsed())?;
        (*unknown >= UNKNOWN_PER_WINDOW && !left.is_zero()).then_some(left)
    }

    /// Counts a credential from `address` that was looked up and found unknown.
    pub fn unknown(&self, address: &str) {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if !windows.room_for(address, WINDOW) {
            return;
        }
        let window = windows.entries.entry(address.to_owned()).or_insert((Instant::now(), 0));
        if window.0.elapsed() >= WINDOW {
            *window = (Instant::now(), 0);
        }
        window.1 = window.1.saturating_add(1);
    }

    /// Remembers that `credential` (its hash) was found live.
    pub fn live(&self, credential: &str) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if live.room_for(credential, LIVE_FOR) {
            live.entries.insert(credential.to_owned(), (Instant::now(), ()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ago(d: Duration) -> Instant {
        Instant::now().checked_sub(d).expect("up for longer than that")
    }

    #[test]
    fn an_address_past_its_unknown_credentials_waits_out_the_window_and_others_do_not() {
        let seen = UnknownCredentials::default();
        for _ in 0..UNKNOWN_PER_WINDOW - 1 {
            seen.unknown("api 192.0.2.1");
        }
        assert_eq!(seen.wait("api 192.0.2.1", "guess"), None, "still under the limit");
        seen.unknown("api 192.0.2.1");
        let wait = seen.wait("api 192.0.2.1", "guess").expect("at the limit");
        assert!(wait > WINDOW - Duration::from_secs(5) && wait <= WINDOW, "{wait:?}");
        assert_eq!(seen.wait("api 192.0.2.2", "guess"), None, "another address is not held back");
        assert_eq!(seen.wait("dashboard 192.0.2.1", "guess"), None, "nor the same address's other count");

        // A credential found live lately is looked up all the same.
        seen.live("token");
        assert_eq!(seen.wait("api 192.0.2.1", "token"), None);
        seen.live.lock().expect("lock").entries.insert("token".into(), (ago(LIVE_FOR), ()));
        assert!(seen.wait("api 192.0.2.1", "token").is_some(), "not lately");

        // A window that has ended counts afresh.
        seen.windows.lock().expect("lock").entries.insert("api 192.0.2.1".into(), (ago(WINDOW), UNKNOWN_PER_WINDOW));
        assert_eq!(seen.wait("api 192.0.2.1", "guess"), None);
        seen.unknown("api 192.0.2.1");
        assert_eq!(seen.windows.lock().expect("lock").entries["api 192.0.2.1"].1, 1);
    }

    #[test]
    fn the_addresses_counted_are_bounded_and_pruned_at_most_once_a_window() {
        let seen = UnknownCredentials::default();
        for i in 0..MAX_ENTRIES + 10 {
            seen.unknown(&format!("api {i}"));
        }
        assert_eq!(seen.windows.lock().expect("lock").entries.len(), MAX_ENTRIES);
        // Once their windows have ended, the old ones make room for new ones.
        for w in seen.windows.lock().expect("lock").entries.values_mut() {
            w.0 = ago(WINDOW);
        }
        seen.unknown("api new");
        assert_eq!(seen.windows.lock().expect("lock").entries.len(), MAX_ENTRIES, "pruned within this window already");
        seen.windows.lock().expect("lock").pruned_at = Some(ago(WINDOW));
        seen.unknown("api newer");
        assert_eq!(seen.windows.lock().expect("lock").entries.len(), 1);
    }
}
