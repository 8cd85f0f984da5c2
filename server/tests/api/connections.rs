//! Connections as a real client makes them, over TCP: bounded in number, in how long a client
//! may take to send a request's head, and in how long a stopping server waits for them.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use rebound_server::connections::{self, ConnectionLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A server answering `/peer` with the client's address as the handler saw it; stopped by
/// sending on (or dropping) the returned sender.
async fn start(limits: ConnectionLimits) -> (SocketAddr, oneshot::Sender<()>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let app = Router::new().route("/peer", get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }));
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(connections::serve(listener, app, limits, async move {
        let _ = stopped.await;
    }));
    (addr, stop, served)
}

/// Waits (up to 10 s) until the server closes `conn`; returns when it did.
async fn closed(mut conn: TcpStream) -> Instant {
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    read.await.expect("the server never closed the connection");
    Instant::now()
}

/// Sends `GET /peer` on `conn` and reads the answer's body (the connection is kept alive).
async fn ask_peer(conn: &mut TcpStream) -> String {
    conn.write_all(b"GET /peer HTTP/1.1\r\nHost: t\r\n\r\n").await.expect("send");
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = tokio::time::timeout_at(deadline, conn.read(&mut buf)).await.expect("answered in time").expect("read");
        assert!(n > 0, "closed before answering: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            let length: usize = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                .and_then(|v| v.parse().ok())
                .expect("a content length");
            if body.len() >= length {
                return body[..length].to_owned();
            }
        }
    }
}

fn limits(max_open: usize, header_timeout: Duration, shutdown_grace: Duration) -> ConnectionLimits {
    ConnectionLimits { max_open, header_timeout, shutdown_grace }
}

#[tokio::test]
async fn a_client_that_sends_nothing_or_sits_idle_is_closed_at_the_header_timeout() {
    let (addr, _stop, _served) = start(limits(8, Duration::from_millis(300), Duration::from_secs(1))).await;
    let opened = Instant::now();
    let silent = TcpStream::connect(addr).await.expect("connect");
    let at = closed(silent).await;
    assert!(at - opened >= Duration::from_millis(250), "closed before its timeout: {:?}", at - opened);

    // Kept alive after an answer, then idle: closed as well. The handler saw the client's
    // own address (sign-in throttling counts by it).
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(ask_peer(&mut conn).await, conn.local_addr().expect("address").to_string());
    assert_eq!(ask_peer(&mut conn).await, conn.local_addr().expect("address").to_string(), "kept alive between requests");
    closed(conn).await;
}

#[tokio::test]
async fn past_the_connection_cap_a_client_is_served_only_once_a_connection_closes() {
    let (addr, _stop, _served) = start(limits(2, Duration::from_millis(800), Duration::from_secs(1))).await;
    let opened = Instant::now();
    let first = TcpStream::connect(addr).await.expect("connect");
    let second = TcpStream::connect(addr).await.expect("connect");
    let first_closed = tokio::spawn(closed(first));
    let second_closed = tokio::spawn(closed(second));
    // Connected (the backlog takes it) but not served while both slots are held: the first
    // slot frees when an idle connection reaches its header timeout, 800 ms after it opened.
    let mut third = TcpStream::connect(addr).await.expect("connect");
    ask_peer(&mut third).await;
    let waited = opened.elapsed();
    assert!(waited >= Duration::from_millis(750), "the third connection was served after {waited:?}, while two others held every slot");
    first_closed.await.expect("first");
    second_closed.await.expect("second");
    // With a slot free, a client is served at once.
    let mut fourth = TcpStream::connect(addr).await.expect("connect");
    let asked = Instant::now();
    ask_peer(&mut fourth).await;
    // Generous for a loaded machine; a slot never freed would hold it for good.
    assert!(asked.elapsed() < Duration::from_secs(5), "{:?}", asked.elapsed());
}

#[tokio::test]
async fn a_stopping_server_does_not_wait_for_ever_on_an_open_connection() {
    // A header timeout far past the test: only the shutdown grace can end the wait.
    let (addr, stop, served) = start(limits(8, Duration::from_secs(600), Duration::from_millis(300))).await;
    // Half a request's head: the connection is busy, so a graceful stop waits for it.
    let mut halfway = TcpStream::connect(addr).await.expect("connect");
    halfway.write_all(b"GET /peer HTTP/1.1\r\nHost: t\r\n").await.expect("send");
    // Accepted in order: once this one is answered, the first was accepted too.
    let mut kept = TcpStream::connect(addr).await.expect("connect");
    ask_peer(&mut kept).await;
    let stopping = Instant::now();
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), served).await.expect("the server stopped within its grace").expect("serve");
    assert!(stopping.elapsed() >= Duration::from_millis(250), "the busy connection was not waited for: {:?}", stopping.elapsed());
    // The idle one was closed at once.
    closed(kept).await;
    // And it takes no new connection.
    assert!(TcpStream::connect(addr).await.is_err(), "still listening after it stopped");
}
