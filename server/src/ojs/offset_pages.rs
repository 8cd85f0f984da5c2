//! Offset paging on top of keyset pages, for clients that only know `?offset=` (the Python and
//! Go SDKs page dead letters that way).
//!
//! Every page served remembers where the next offset starts (the last id it returned), so a
//! client walking `offset=0, 50, 100, …` gets each page by keyset (`id < last`), as cheaply as
//! with a cursor. An offset nobody reached that way is found once by an id-only scan
//! ([`rebound_queue::Store::job_id_at_offset`]), at most [`MAX_SCANNED_OFFSET`] deep.
//! Boundaries are remembered per listing filter; the map is bounded and simply forgotten when
//! full.

use std::collections::HashMap;
use std::sync::Mutex;

use uuid::Uuid;

use super::error::ApiError;

/// The deepest offset found by scanning: reading the ids before it is work in proportion to
/// it (0.5–0.8 s at this depth for a bare index of ids, a machine of this kind under load), on
/// every request, since an offset past the end is never remembered. Deeper pages are served
/// following the page before them, if this process still remembers it (the map is per
/// process and bounded), or by cursor.
pub const MAX_SCANNED_OFFSET: i64 = 1_000_000;

/// The refusal of an offset deeper than [`MAX_SCANNED_OFFSET`] that no page served led to,
/// naming `field` (`offset` or `page`).
pub fn too_deep(field: &str, offset: i64) -> ApiError {
    ApiError::invalid_field(
        field,
        format!(
            "an offset of {offset} is deeper than the {MAX_SCANNED_OFFSET} a page may skip unless the page before it was just served: page on from there, or by cursor"
        ),
    )
}

/// Most boundaries kept before the map is cleared.
const CAPACITY: usize = 4096;

/// Where offsets begin, per listing.
#[derive(Debug, Default)]
pub struct OffsetPages {
    starts: Mutex<HashMap<(String, i64), Uuid>>,
}

impl OffsetPages {
    /// The id after which `offset` begins in the listing `listing`, if a served page told us.
    pub fn start_of(&self, listing: &str, offset: i64) -> Option<Uuid> {
        let starts = self.starts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        starts.get(&(listing.to_owned(), offset)).copied()
    }

    /// Records that `offset` begins after `last_id` in `listing`.
    pub fn remember(&self, listing: &str, offset: i64, last_id: Uuid) {
        let mut starts = self.starts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if starts.len() >= CAPACITY {
            starts.clear();
        }
        starts.insert((listing.to_owned(), offset), last_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_per_listing_and_stays_bounded() {
        let pages = OffsetPages::default();
        let id = Uuid::now_v7();
        pages.remember("q=a", 50, id);
        assert_eq!(pages.start_of("q=a", 50), Some(id));
        assert_eq!(pages.start_of("q=b", 50), None);
        for i in 0..(CAPACITY as i64 + 1) {
            pages.remember("q=c", i, id);
        }
        assert!(pages.start_of("q=a", 50).is_none(), "cleared once full");
    }
}
