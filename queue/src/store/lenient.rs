//! Decoding stored values leniently, so one row written by hand or by an older version without
//! [`crate::bounds`] cannot make a whole claim, listing or page fail to decode.
//!
//! * [`StoredTime`]: Postgres holds instants far outside jiff's years -9999 ..= 9999 (and
//!   `±infinity`); such a time reads as [`Timestamp::MIN`] or [`Timestamp::MAX`].
//! * [`StoredJson`]: `jsonb` gives numbers back written out in full, and serde_json cannot read
//!   every such number as a float (see [`crate::storable`]); such a number reads as a string.
//!   A value nested deeper than serde_json reads (a workflow step's `parent_results` wrapping
//!   a deep result, stored before input depth was bounded) reads with its parts below
//!   [`crate::storable::MAX_DEPTH`] as their JSON text: the job stays claimable and visible.

use jiff::Timestamp;
use serde_json::Value;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgTypeInfo, PgValueFormat, PgValueRef};
use sqlx::{Decode, Postgres, Type};

/// A `timestamptz`, saturating at jiff's range.
pub(crate) struct StoredTime(pub Timestamp);

/// Postgres counts `timestamptz` in microseconds from 2000-01-01T00:00:00Z.
const POSTGRES_EPOCH: Timestamp = Timestamp::constant(946_684_800, 0);

impl Type<Postgres> for StoredTime {
    fn type_info() -> PgTypeInfo {
        <jiff_sqlx::Timestamp as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <jiff_sqlx::Timestamp as Type<Postgres>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Postgres> for StoredTime {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        let t = match value.format() {
            PgValueFormat::Binary => {
                let micros: i64 = Decode::<Postgres>::decode(value)?;
                saturating_instant(micros)
            }
            PgValueFormat::Text => {
                let text = value.as_str()?;
                match text.parse::<Timestamp>() {
                    Ok(t) => t,
                    Err(_) if text.starts_with('-') || text.ends_with(" BC") => Timestamp::MIN,
                    Err(_) => Timestamp::MAX,
                }
            }
        };
        Ok(StoredTime(t))
    }
}

/// The instant `micros` after the Postgres epoch, saturating at jiff's range.
fn saturating_instant(micros: i64) -> Timestamp {
    POSTGRES_EPOCH
        .checked_add(jiff::SignedDuration::from_micros(micros))
        .unwrap_or(if micros < 0 { Timestamp::MIN } else { Timestamp::MAX })
}

/// A `json` / `jsonb` value; numbers serde_json cannot read come back as strings, nesting it
/// cannot read as JSON text.
pub(crate) struct StoredJson(pub Value);

impl Type<Postgres> for StoredJson {
    fn type_info() -> PgTypeInfo {
        <Value as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <Value as Type<Postgres>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Postgres> for StoredJson {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        let mut bytes = value.as_bytes()?;
        // Binary `jsonb` starts with its format version (1); JSON text never starts with 0x01.
        if value.format() == PgValueFormat::Binary && bytes.first() == Some(&1) {
            bytes = &bytes[1..];
        }
        match serde_json::from_slice(bytes) {
            Ok(v) => Ok(StoredJson(v)),
            // Only on failure: the fast path stays serde_json's own.
            Err(e) => {
                let text = std::str::from_utf8(bytes).map_err(|_| e)?;
                Ok(StoredJson(crate::storable::parse_lenient(text)?))
            }
        }
    }
}
