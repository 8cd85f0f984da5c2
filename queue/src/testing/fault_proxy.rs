//! A TCP proxy between a client and Postgres that breaks connections at exact points of the
//! wire protocol, so faults that are races in production happen on purpose in tests.
//!
//! A database that dies "after the commit but before the client read the answer" is the case
//! that costs jobs, and a real restart hits it only by luck. The proxy reads the protocol's
//! message framing in both directions (it never changes a byte it forwards), recognises a
//! statement by a fragment of its SQL text, and at that statement can:
//!
//! * [`FaultPoint::BeforeSend`]: drop the connection as the client sends it, so the server
//!   never runs it;
//! * [`FaultPoint::AfterCommit`]: let it run, wait until the server reports the session idle
//!   again (its own autocommit, or the `COMMIT` of the transaction it ran in), then drop the
//!   connection without forwarding any of those answers: committed, answer lost;
//! * [`FaultPoint::Delay`]: hold its answer back, so a client can be cancelled while the
//!   statement is in flight;
//! * [`FaultPoint::HoldRequest`]: hold the statement back before the server sees it, so the
//!   world moves on between the moment the client decided what to send and its execution;
//! * [`FaultPoint::DuringCopy`]: cut a `COPY … FROM STDIN` off in the middle of its data.
//!
//! Connect through [`FaultProxy::url`]; TLS is turned off on that URL because the proxy must
//! read the messages.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Where in a statement's life the fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPoint {
    /// The connection drops as the client sends the statement; the server never runs it.
    BeforeSend,
    /// The statement runs and commits; the connection drops before the client reads a byte
    /// of the answer.
    AfterCommit,
    /// The answer is held back this long; the connection stays up.
    Delay(Duration),
    /// The statement itself is held back this long before the server sees it, as when it
    /// waits for a connection while the database is away.
    HoldRequest(Duration),
    /// The statement is a `COPY … FROM STDIN`: the connection drops as the client sends the
    /// second piece of its data (or its end, if it had one piece), after the first has reached
    /// the server.
    DuringCopy,
}

/// A fault armed on the proxy: strikes the next `times` statements whose SQL contains `sql`.
#[derive(Clone, Debug)]
pub struct Fault {
    pub sql: String,
    pub point: FaultPoint,
    pub times: u32,
}

impl Fault {
    /// Strikes once.
    pub fn once(sql: impl Into<String>, point: FaultPoint) -> Fault {
        Fault { sql: sql.into(), point, times: 1 }
    }
}

/// How often an armed fault struck so far.
#[derive(Clone, Debug)]
pub struct FaultHits(Arc<Armed>);

impl FaultHits {
    pub fn count(&self) -> u32 {
        self.0.hits.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct Armed {
    sql: String,
    point: FaultPoint,
    remaining: AtomicU32,
    hits: AtomicU32,
}

impl Armed {
    /// Takes one strike if any is left.
    fn strike(&self) -> bool {
        let took = self.remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if took {
            self.hits.fetch_add(1, Ordering::SeqCst);
        }
        took
    }
}

#[derive(Debug, Default)]
struct Shared {
    faults: Mutex<Vec<Arc<Armed>>>,
    connections: Mutex<Vec<CancellationToken>>,
}

impl Shared {
    fn matching(&self, sql: &str) -> Option<FaultPoint> {
        let faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        faults.iter().find(|f| sql.contains(&f.sql) && f.strike()).map(|f| f.point)
    }
}

/// A running proxy; it stops (and drops every connection) when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: PgConnectOptions,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of the server `url` points at.
    pub async fn in_front_of(url: &str) -> FaultProxy {
        let upstream: PgConnectOptions = url.parse().expect("a postgres:// URL");
        let target = format!("{}:{}", upstream.get_host(), upstream.get_port());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, target, shared.clone(), stop.clone()));
        FaultProxy { addr, upstream, shared, stop }
    }

    /// The URL of `database` through the proxy.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{}@{}/{}?sslmode=disable", self.upstream.get_username(), self.addr, database)
    }

    /// Arms a fault; it stays armed until it has struck `times` times or [`FaultProxy::clear`].
    pub fn inject(&self, fault: Fault) -> FaultHits {
        let armed = Arc::new(Armed { sql: fault.sql, point: fault.point, remaining: AtomicU32::new(fault.times), hits: AtomicU32::new(0) });
        self.shared.faults.lock().unwrap_or_else(|p| p.into_inner()).push(armed.clone());
        FaultHits(armed)
    }

    /// Disarms every fault.
    pub fn clear(&self) {
        self.shared.faults.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Drops every connection open through the proxy now (new ones are accepted).
    pub fn drop_connections(&self) {
        for c in self.shared.connections.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            c.cancel();
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.drop_connections();
    }
}

async fn accept(listener: TcpListener, target: String, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let client = tokio::select! {
            _ = stop.cancelled() => return,
            c = listener.accept() => match c {
                Ok((c, _)) => c,
                Err(_) => continue,
            },
        };
        let kill = stop.child_token();
        {
            let mut conns = shared.connections.lock().unwrap_or_else(|p| p.into_inner());
            conns.retain(|c| !c.is_cancelled());
            conns.push(kill.clone());
        }
        let (target, shared) = (target.clone(), shared.clone());
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(&target).await else { return };
            tokio::select! {
                _ = kill.cancelled() => {}
                _ = relay(client, server, shared, kill.clone()) => {}
            }
            kill.cancel();
        });
    }
}

/// What the backend direction must do with the answers to one `Sync` (or simple query).
#[derive(Debug, Default)]
struct Pending {
    /// Answers to hold back, and for how long.
    delay: Option<Duration>,
    /// Drop the connection once the session is idle again, forwarding nothing until then.
    fire_when_idle: bool,
}

#[derive(Debug, Default)]
struct Conversation {
    /// Per `Sync`/`Query` sent, in order: `None` when no fault applies to its answers.
    pending: VecDeque<Option<Pending>>,
}

async fn relay(mut client: TcpStream, mut server: TcpStream, shared: Arc<Shared>, kill: CancellationToken) {
    if startup(&mut client, &mut server).await.is_err() {
        return;
    }
    let conversation = Arc::new(Mutex::new(Conversation::default()));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let front = frontend(client_read, server_write, shared, conversation.clone(), kill.clone());
    let back = backend(server_read, client_write, conversation, kill.clone());
    tokio::select! {
        _ = front => {}
        _ = back => {}
    }
}

/// The untyped start of a session: an optional SSL/GSS request (answered with one byte), then
/// the startup message. A cancel request is passed through and the session ends.
async fn startup(client: &mut TcpStream, server: &mut TcpStream) -> std::io::Result<()> {
    loop {
        let len = client.read_u32().await?;
        let mut body = vec![0u8; (len as usize).saturating_sub(4)];
        client.read_exact(&mut body).await?;
        server.write_u32(len).await?;
        server.write_all(&body).await?;
        let code = body.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
        match code {
            // SSLRequest / GSSENCRequest: the server answers with a single byte.
            80_877_103 | 80_877_104 => {
                let answer = server.read_u8().await?;
                client.write_u8(answer).await?;
            }
            _ => return Ok(()),
        }
    }
}

async fn read_message(from: &mut OwnedReadHalf) -> std::io::Result<(u8, Vec<u8>)> {
    let kind = from.read_u8().await?;
    let len = from.read_u32().await?;
    let mut body = vec![0u8; (len as usize).saturating_sub(4)];
    from.read_exact(&mut body).await?;
    Ok((kind, body))
}

fn encode(kind: u8, body: &[u8], out: &mut Vec<u8>) {
    out.push(kind);
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(body);
}

/// The C strings at the start of a message body.
fn cstrings(body: &[u8], n: usize) -> Vec<String> {
    body.split(|b| *b == 0).take(n).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
}

async fn frontend(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shared: Arc<Shared>, conversation: Arc<Mutex<Conversation>>, kill: CancellationToken) {
    let mut statements: HashMap<String, String> = HashMap::new();
    let mut bound = String::new();
    let mut this_sync: Option<Pending> = None;
    // Pieces of data a struck COPY has sent so far.
    let mut copy_pieces: Option<u32> = None;
    loop {
        let Ok((kind, body)) = read_message(&mut from).await else { return };
        if kind == b'Q' {
            // A struck COPY's cut applies to that statement alone.
            copy_pieces = None;
        }
        let mut hold = None;
        let mut strike = |sql: &str, this_sync: &mut Option<Pending>| -> bool {
            match shared.matching(sql) {
                Some(FaultPoint::BeforeSend) => return true,
                Some(FaultPoint::DuringCopy) => copy_pieces = Some(0),
                Some(FaultPoint::AfterCommit) => this_sync.get_or_insert_with(Pending::default).fire_when_idle = true,
                Some(FaultPoint::Delay(d)) => this_sync.get_or_insert_with(Pending::default).delay = Some(d),
                Some(FaultPoint::HoldRequest(d)) => hold = Some(d),
                None => {}
            }
            false
        };
        match kind {
            b'P' => {
                let parts = cstrings(&body, 2);
                if let [name, sql] = parts.as_slice() {
                    statements.insert(name.clone(), sql.clone());
                }
            }
            b'B' => {
                bound = cstrings(&body, 2).get(1).cloned().unwrap_or_default();
            }
            b'E' => {
                let sql = statements.get(&bound).cloned().unwrap_or_default();
                if strike(&sql, &mut this_sync) {
                    kill.cancel();
                    return;
                }
            }
            b'Q' => {
                let sql = cstrings(&body, 1).pop().unwrap_or_default();
                if strike(&sql, &mut this_sync) {
                    kill.cancel();
                    return;
                }
                conversation.lock().unwrap_or_else(|p| p.into_inner()).pending.push_back(this_sync.take());
            }
            b'S' => {
                conversation.lock().unwrap_or_else(|p| p.into_inner()).pending.push_back(this_sync.take());
            }
            // CopyData, CopyDone: a struck COPY's second piece never arrives, nor its end.
            b'd' | b'c' if copy_pieces.is_some() => {
                let sent = copy_pieces.unwrap_or(0);
                if sent >= 1 || kind == b'c' {
                    kill.cancel();
                    return;
                }
                copy_pieces = Some(sent + 1);
            }
            _ => {}
        }
        if let Some(d) = hold.take() {
            tokio::time::sleep(d).await;
        }
        let mut out = Vec::with_capacity(body.len() + 5);
        encode(kind, &body, &mut out);
        if to.write_all(&out).await.is_err() {
            return;
        }
    }
}

async fn backend(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, conversation: Arc<Mutex<Conversation>>, kill: CancellationToken) {
    let mut held: Vec<u8> = Vec::new();
    let mut fire_when_idle = false;
    loop {
        let Ok((kind, body)) = read_message(&mut from).await else { return };
        let front_has_fault = {
            let c = conversation.lock().unwrap_or_else(|p| p.into_inner());
            matches!(c.pending.front(), Some(Some(_)))
        };
        encode(kind, &body, &mut held);
        if kind == b'Z' {
            let this = conversation.lock().unwrap_or_else(|p| p.into_inner()).pending.pop_front().flatten();
            if let Some(p) = &this {
                fire_when_idle |= p.fire_when_idle;
                if let Some(d) = p.delay {
                    tokio::time::sleep(d).await;
                }
            }
            let idle = body.first() == Some(&b'I');
            if fire_when_idle && idle {
                kill.cancel();
                return;
            }
            // Still inside the transaction the faulted statement ran in: the client needs
            // this answer to go on to its COMMIT, whose answer is the one that is lost.
        } else if front_has_fault || fire_when_idle {
            continue;
        }
        if to.write_all(&held).await.is_err() {
            return;
        }
        held.clear();
    }
}
