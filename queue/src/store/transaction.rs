//! Transactions that a cancelled caller cannot leave open.
//!
//! sqlx's `Pool::begin` is not cancel-safe on Postgres (transact-rs/sqlx#4393, still so in
//! 0.9.0): a future dropped while `BEGIN` is on the wire leaves the session inside a
//! transaction that sqlx does not know about, and the pool hands that connection to the next
//! borrower. Every later statement on it — completions, heartbeats, anything — then runs inside
//! the stale transaction, holds its row locks and is silently rolled back when the connection
//! finally closes. Futures are dropped routinely: an HTTP client disconnects, a `select!`
//! picks another branch, a shutdown deadline passes.
//!
//! [`Tx`] makes that impossible instead of unlikely. It owns its pooled connection and sends
//! `BEGIN`/`COMMIT`/`ROLLBACK` itself; unless it ended the transaction, dropping it closes the
//! connection rather than returning it to the pool, and Postgres rolls back whatever the
//! session had open when it ends. Callers still avoid cancelling a transaction (a close costs a
//! reconnect); this is the layer that holds when one is cancelled anyway. The server-side
//! `idle_in_transaction_session_timeout` set in [`super::Store::connect`] is the last layer.

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::{Executor, PgConnection, Postgres};

use super::{Store, StoreError};

/// An open transaction on a connection of its own. Commit with [`Tx::commit`] or end it with
/// [`Tx::rollback`]; dropped while open, its connection is closed, never reused.
pub(crate) struct Tx {
    /// Settled only once `COMMIT`/`ROLLBACK` is answered, so a future dropped at any point from
    /// `BEGIN` on closes the connection: closing ends the session, and with it the
    /// transaction, whatever state the protocol was left in.
    conn: Answered,
}

impl Store {
    /// Begins a transaction (see the module docs for why this, not `pool.begin()`).
    pub(crate) async fn begin(&self) -> Result<Tx, StoreError> {
        let mut conn = self.for_answer().await?;
        conn.execute(sqlx::raw_sql("BEGIN")).await?;
        Ok(Tx { conn })
    }
}

impl Tx {
    /// Commits. On error the transaction's fate is unknown to us; the connection is closed.
    pub(crate) async fn commit(self) -> Result<(), StoreError> {
        let Tx { mut conn } = self;
        conn.execute(sqlx::raw_sql("COMMIT")).await?;
        conn.done();
        Ok(())
    }

    /// Rolls back, for callers that decide not to write after all; the connection is reused.
    pub(crate) async fn rollback(self) -> Result<(), StoreError> {
        let Tx { mut conn } = self;
        conn.execute(sqlx::raw_sql("ROLLBACK")).await?;
        conn.done();
        Ok(())
    }
}

impl Deref for Tx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

/// A pooled connection for statements whose effect must not outlive a caller that gave up on
/// them (a [`Tx`], or one autocommit statement): dropped before [`Answered::done`], it is
/// closed, not pooled. Returning it to the pool is what must never happen: for a [`Tx`], the
/// next borrower would run inside the stale transaction; for a single statement, sqlx would
/// wait for it to finish, so one waiting on a lock would still commit, long after its caller
/// stopped listening (a claim would then leave jobs active under a name nobody waits on). Closed, Postgres notices within
/// [`super::CLIENT_CHECK_INTERVAL`] that no one is there and ends the statement, rolled back.
pub(crate) struct Answered {
    conn: PoolConnection<Postgres>,
    done: bool,
}

impl Store {
    /// A connection for a statement whose caller may give up on it (see [`Answered`]).
    pub(crate) async fn for_answer(&self) -> Result<Answered, StoreError> {
        Ok(Answered { conn: self.pool.acquire().await?, done: false })
    }
}

impl Answered {
    /// The statement was answered (or failed and said so): the connection may be reused.
    pub(crate) fn done(mut self) {
        self.done = true;
    }
}

impl Deref for Answered {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for Answered {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        if !self.done {
            self.conn.close_on_drop();
        }
    }
}
