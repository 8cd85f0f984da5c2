//! Which handler runs which job type, and the type's default per-attempt timeout.
//!
//! Types are matched exactly first, then by the longest `prefix.*` pattern, so a config can
//! send every `reports.*` job to one command and still single out `reports.monthly`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rebound_queue::job::{JobValidationError, validate_type};

use crate::handler::Handler;

/// A registered handler and its per-type settings.
#[derive(Clone)]
pub struct Registration {
    pub handler: Arc<dyn Handler>,
    /// The type's default per-attempt timeout, used when the job sets none.
    pub timeout: Option<Duration>,
}

/// The job type → handler map.
#[derive(Clone, Default)]
pub struct HandlerRegistry {
    exact: HashMap<String, Registration>,
    /// `(prefix including the trailing dot, registration)`, longest prefix first.
    prefixes: Vec<(String, Registration)>,
}

impl std::fmt::Debug for HandlerRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerRegistry").field("types", &self.types()).finish()
    }
}

impl HandlerRegistry {
    pub fn new() -> Self {
        HandlerRegistry::default()
    }

    /// Registers `handler` for `pattern`: a job type (`email.send`) or `prefix.*`. A later
    /// registration of the same pattern replaces the earlier one.
    pub fn register(&mut self, pattern: &str, handler: Arc<dyn Handler>, timeout: Option<Duration>) -> Result<(), JobValidationError> {
        let registration = Registration { handler, timeout };
        match pattern.strip_suffix(".*") {
            Some(prefix) => {
                validate_type(prefix)?;
                let key = format!("{prefix}.");
                self.prefixes.retain(|(p, _)| *p != key);
                self.prefixes.push((key, registration));
                self.prefixes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
            }
            None => {
                validate_type(pattern)?;
                self.exact.insert(pattern.to_string(), registration);
            }
        }
        Ok(())
    }

    /// Sets the default timeout of an already registered pattern; false if there is none.
    pub fn set_timeout(&mut self, pattern: &str, timeout: Duration) -> bool {
        let found = match pattern.strip_suffix(".*") {
            Some(prefix) => {
                let key = format!("{prefix}.");
                self.prefixes.iter_mut().find(|(p, _)| *p == key).map(|(_, r)| r)
            }
            None => self.exact.get_mut(pattern),
        };
        match found {
            Some(r) => {
                r.timeout = Some(timeout);
                true
            }
            None => false,
        }
    }

    /// The registration that runs jobs of `job_type`, if any.
    pub fn lookup(&self, job_type: &str) -> Option<&Registration> {
        self.exact
            .get(job_type)
            .or_else(|| self.prefixes.iter().find(|(p, _)| job_type.starts_with(p.as_str())).map(|(_, r)| r))
    }

    /// Every registered pattern, sorted.
    pub fn types(&self) -> Vec<String> {
        let mut out: Vec<String> = self.exact.keys().cloned().collect();
        out.extend(self.prefixes.iter().map(|(p, _)| format!("{p}*")));
        out.sort();
        out
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::handler_fn;

    fn noop() -> Arc<dyn Handler> {
        Arc::new(handler_fn(|_| async { Ok(None) }))
    }

    #[test]
    fn exact_beats_the_longest_prefix_which_beats_shorter_ones() {
        let mut r = HandlerRegistry::new();
        r.register("reports.*", noop(), Some(Duration::from_secs(1))).unwrap();
        r.register("reports.monthly.*", noop(), Some(Duration::from_secs(2))).unwrap();
        r.register("reports.monthly", noop(), Some(Duration::from_secs(3))).unwrap();
        let timeout = |t: &str| r.lookup(t).and_then(|x| x.timeout);
        assert_eq!(timeout("reports.monthly"), Some(Duration::from_secs(3)));
        assert_eq!(timeout("reports.monthly.eu"), Some(Duration::from_secs(2)));
        assert_eq!(timeout("reports.daily"), Some(Duration::from_secs(1)));
        assert!(r.lookup("reportsx").is_none());
        assert!(r.lookup("email.send").is_none());
        assert_eq!(r.types(), vec!["reports.*", "reports.monthly", "reports.monthly.*"]);
    }

    #[test]
    fn invalid_patterns_are_refused() {
        let mut r = HandlerRegistry::new();
        assert!(r.register("Bad Type", noop(), None).is_err());
        assert!(r.register("bad..*", noop(), None).is_err());
        assert!(r.is_empty());
        r.register("a.b", noop(), None).unwrap();
        assert!(r.set_timeout("a.b", Duration::from_secs(9)));
        assert!(!r.set_timeout("c.d", Duration::from_secs(9)));
        assert_eq!(r.lookup("a.b").and_then(|x| x.timeout), Some(Duration::from_secs(9)));
    }
}
