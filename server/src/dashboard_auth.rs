//! Dashboard sign-in: the login and logout handlers and the session middleware.
//!
//! A session is a random token in an `HttpOnly`, `SameSite=Lax` cookie (`Secure`, and named
//! [`SECURE_SESSION_COOKIE`], over HTTPS or with `--secure-cookies`); the store keeps only its
//! SHA-256 (like API tokens: random, so a plain hash is enough), the operator, a per-session
//! CSRF token and the expiry ([`SESSION_TTL`], not extended by use). A session unused for
//! `--session-idle-timeout` ends sooner. Signing in ends the browser's previous session. The
//! middleware resolves the cookie once per request and hands the session to the app as a
//! request extension; pages without one redirect to the login page. Every dashboard response
//! is `Cache-Control: no-store`. The checks every request passes first are in
//! [`dashboard_guard`](crate::dashboard_guard); sign-in throttling in
//! [`login_throttle`](crate::login_throttle).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{ACCEPT, CACHE_CONTROL, COOKIE, LOCATION, RETRY_AFTER, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use rebound_queue::store::{Actor, Session, StoreError};
use serde::Deserialize;
use serde_json::json;

use app::auth::SignedIn;
use app::error::AppError;

use crate::AppState;
use crate::auth::hash_token;
use crate::dashboard_guard::{self as guard, FlashCheck};
use crate::login_throttle;
use crate::request_body;
use crate::passwords::verify_password;

/// The session cookie's name when it is not `Secure` (plain HTTP, e.g. on localhost).
pub const SESSION_COOKIE: &str = "rebound_session";

/// The session cookie's name when it is `Secure`. Browsers keep a `__Host-` cookie only if it
/// came over HTTPS with `Path=/` and no `Domain`, so no plain-HTTP response and no other host
/// (a sibling subdomain) can set or replace it. Both names are read (this one first): a
/// browser may still hold a cookie from before the server said it was behind HTTPS.
pub const SECURE_SESSION_COOKIE: &str = "__Host-rebound_session";

/// The device cookie's names, plain and `Secure` (see [`SECURE_SESSION_COOKIE`] for the
/// prefix): a random token marking a browser its operator signed in from, which lets that
/// operator's later sign-ins from it skip the throttles and the queue strangers share (see
/// [`login_throttle::DEVICE`]). It is not a credential: the password is still checked.
pub const DEVICE_COOKIE: &str = "rebound_device";
pub const SECURE_DEVICE_COOKIE: &str = "__Host-rebound_device";

/// How long a device is remembered after its last sign-in.
pub const DEVICE_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// How many devices an operator keeps (the most recently used).
const DEVICES_KEPT: i64 = 20;

/// How long a session lasts without logging in again.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// A hash no password matches: checked against when the username is unknown, so the response
/// takes as long as for a wrong password and does not reveal which usernames exist.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$N4M3cW8Ji2cL8XJl0nO1Q0P8lK2m1y9QG3d0r1kB2e8";

/// 32 random bytes from the OS, in hex.
fn random_secret() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

/// The value of cookie `name`, if the request sent it.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
        .filter(|v| !v.is_empty())
}

/// The session tokens the request's cookies carry: the [`SECURE_SESSION_COOKIE`] one first,
/// then the [`SESSION_COOKIE`] one. A value that is not a token as [`random_secret`] writes
/// them is no session and is never looked up: junk cookies cost the database nothing.
fn session_tokens(headers: &HeaderMap) -> Vec<String> {
    [SECURE_SESSION_COOKIE, SESSION_COOKIE].into_iter().filter_map(|name| session_cookie_value(headers, name)).collect()
}

/// Cookie `name`'s value if it has a session token's shape.
fn session_cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    cookie_value(headers, name).filter(|v| crate::auth::is_secret_hex(v))
}

/// The session token a request signs in with: over HTTPS only the [`SECURE_SESSION_COOKIE`]
/// one (a plain-named cookie there may have been planted by a sibling subdomain or over plain
/// HTTP, which is what the `__Host-` prefix rules out), over plain HTTP only the plain one.
fn signing_in_token(headers: &HeaderMap, secure: bool) -> Vec<String> {
    session_cookie_value(headers, if secure { SECURE_SESSION_COOKIE } else { SESSION_COOKIE }).into_iter().collect()
}

/// Ends the sessions of every one of `tokens` (a browser's session cookies).
async fn end_sessions(state: &AppState, tokens: &[String]) -> Result<(), StoreError> {
    for token in tokens {
        state.store.delete_session(&hash_token(token)).await?;
    }
    Ok(())
}

/// The live session of the first of `tokens` that has one. A session unused for longer than
/// `--session-idle-timeout` has none (and ends).
async fn resolve_session(state: &AppState, tokens: &[String]) -> Result<Option<Session>, StoreError> {
    for token in tokens {
        if let Some(session) = state.store.live_session(&hash_token(token), state.config.session_idle_timeout).await? {
            return Ok(Some(session));
        }
    }
    Ok(None)
}

/// The live session the request signs in with, and whether the cookie it sent named none
/// (looked up and not found: a session ended or expired, or a guess). The cookie of an
/// address that sent too many unknown ones lately is not looked up unless it was found live
/// lately (see [`crate::unknown_credentials`]): the request is signed out, as it most likely
/// is anyway.
async fn signed_in_session(state: &AppState, headers: &HeaderMap, peer: Option<ConnectInfo<SocketAddr>>) -> Result<(Option<Session>, bool), StoreError> {
    let tokens = signing_in_token(headers, secure(state, headers));
    let Some(token) = tokens.first() else { return Ok((None, false)) };
    let hash = hash_token(token);
    let address = format!("dashboard {}", login_throttle::address_key(login_throttle::client_address(headers, peer.as_ref(), state.config.behind_proxy)));
    if state.unknown_credentials.wait(&address, &hash).is_some() {
        tracing::debug!(address = %address, "dashboard: session cookie not looked up: too many unknown ones from this address");
        return Ok((None, false));
    }
    let found = state.store.live_session(&hash, state.config.session_idle_timeout).await?;
    match &found {
        Some(_) => state.unknown_credentials.live(&hash),
        None => state.unknown_credentials.unknown(&address),
    }
    let stale = found.is_none();
    Ok((found, stale))
}

/// Where to go after signing in: `next` if it is a path on this site, else `/`.
///
/// The value is parsed as a URL relative to a placeholder origin (so it is normalised exactly
/// as a browser would: tabs and newlines dropped, `\\` read as `/`, dot segments resolved) and
/// accepted only if it stays on that origin; what is returned is rebuilt from the parsed path
/// and query, never the raw text. Control characters and backslashes are refused outright.
pub fn safe_next(next: Option<&str>) -> String {
    const BASE: &str = "http://rebound.invalid/";
    let Some(next) = next else { return "/".into() };
    if !next.starts_with('/') || next.chars().any(|c| c.is_control() || c == '\\') {
        return "/".into();
    }
    let Ok(base) = url::Url::parse(BASE) else { return "/".into() };
    let Ok(url) = base.join(next) else { return "/".into() };
    if url.origin() != base.origin() || !url.username().is_empty() || url.password().is_some() {
        return "/".into();
    }
    let mut out = url.path().to_string();
    if let Some(q) = url.query() {
        out.push('?');
        out.push_str(q);
    }
    // `//host` is a network path; the parse above cannot yield one, but never emit it.
    if !out.starts_with('/') || out.starts_with("//") { "/".into() } else { out }
}

fn percent_encode(s: &str) -> String {
    app::filters::urlencode(s)
}

fn see_other(location: &str) -> Response {
    let mut res = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        res.headers_mut().insert(LOCATION, v);
    }
    res
}

/// Whether cookies must be `Secure`: forced by `--secure-cookies`, else when the request
/// reached us over HTTPS through a proxy that says so (browsers drop `Secure` cookies sent over
/// plain HTTP to anything but localhost, so this cannot be the default).
fn secure(state: &AppState, headers: &HeaderMap) -> bool {
    state.config.secure_cookies || forwarded_https(headers, state.config.behind_proxy)
}

/// Whether `X-Forwarded-Proto` says the client reached the proxy over HTTPS. Behind a trusted
/// proxy (`--behind-proxy`, as for `X-Forwarded-For`) its first comma-separated value counts,
/// in any case (`HTTPS`; `https, http` from a chain of proxies). Without the flag only the
/// exact value `https` counts, as documented: the header then proves nothing, but whoever
/// sends it can only make their own cookie stricter.
fn forwarded_https(headers: &HeaderMap, behind_proxy: bool) -> bool {
    let Some(proto) = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()) else { return false };
    if behind_proxy {
        proto.split(',').next().is_some_and(|first| first.trim().eq_ignore_ascii_case("https"))
    } else {
        proto == "https"
    }
}

/// An `HttpOnly`, `Path=/` cookie without `Domain`: `secure_name` with `Secure` when
/// `secure` (what a `__Host-` name requires), else `plain_name`.
fn host_cookie(names: (&str, &str), secure: bool, same_site: &str, value: &str, max_age: Duration) -> String {
    let (plain_name, secure_name) = names;
    format!(
        "{}={value}; Path=/; HttpOnly; SameSite={same_site}; Max-Age={}{}",
        if secure { secure_name } else { plain_name },
        max_age.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The session cookie: [`SECURE_SESSION_COOKIE`] when `secure`, else [`SESSION_COOKIE`].
fn session_cookie(secure: bool, value: &str, max_age: Duration) -> String {
    host_cookie((SESSION_COOKIE, SECURE_SESSION_COOKIE), secure, "Lax", value, max_age)
}

/// The device cookie (`SameSite=Strict`: only the login form, a same-site post, needs it).
fn device_cookie(secure: bool, value: &str, max_age: Duration) -> String {
    host_cookie((DEVICE_COOKIE, SECURE_DEVICE_COOKIE), secure, "Strict", value, max_age)
}

/// The device token a sign-in presents, if it presents one of the right shape: over HTTPS
/// only the `__Host-` cookie counts (as for [`signing_in_token`]).
fn device_token(headers: &HeaderMap, secure: bool) -> Option<String> {
    cookie_value(headers, if secure { SECURE_DEVICE_COOKIE } else { DEVICE_COOKIE }).filter(|v| crate::auth::is_secret_hex(v))
}

/// Sets `cookie`, the response's first `Set-Cookie`.
fn set_cookie(res: &mut Response, cookie: &str) {
    if let Ok(v) = HeaderValue::from_str(cookie) {
        res.headers_mut().insert(SET_COOKIE, v);
    }
}

/// Clears a session cookie that names no session, so that a tab left open on an ended session
/// stops sending it (and having it looked up) with every refresh.
fn clear_stale_session_cookie(res: &mut Response, secure: bool) {
    if let Ok(clear) = HeaderValue::from_str(&session_cookie(secure, "", Duration::ZERO)) {
        guard::add_cookie(res, clear);
    }
}

/// Removes the plain-named session cookie a browser may still hold once its session cookie is
/// the `__Host-` one (only a `Secure` response may set that one, so this goes with it).
fn clear_plain_session_cookie(res: &mut Response) {
    if let Ok(v) = HeaderValue::from_str(&session_cookie(false, "", Duration::ZERO)) {
        guard::add_cookie(res, v);
    }
}

fn unavailable(message: &str, retry_after_secs: u64) -> Response {
    let mut res = guard::refusal_page(StatusCode::SERVICE_UNAVAILABLE, message);
    res.headers_mut().insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
    res
}

/// A sign-in told to wait `wait` before trying again (429 with `Retry-After`), logged.
fn throttled(username: &str, address: Option<IpAddr>, wait: Duration) -> Response {
    // Rounded up: a client that waits what it is told is not refused again.
    let secs = wait.as_millis().div_ceil(1000).max(1) as u64;
    tracing::warn!(username = ?username, address = ?address, wait_secs = secs, "dashboard login throttled after repeated failures");
    let mut res = guard::refusal_page(
        StatusCode::TOO_MANY_REQUESTS,
        &format!("Too many failed sign-ins for this account, from this address or network, or from this browser: wait {secs} s and try again."),
    );
    res.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
    res
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    pub username: String,
    pub password: String,
    #[serde(default)]
    pub next: Option<String>,
}

/// How long a sign-in waits for a turn at checking its password before being told to retry.
const PASSWORD_CHECK_QUEUE_WAIT: Duration = Duration::from_secs(10);

/// `POST /auth/login`: checks the password (throttled, see [`login_throttle`]), ends the
/// browser's previous session if it sent one, starts a session, and goes to `next` (see
/// [`safe_next`]).
pub async fn login(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let next = safe_next(form.next.as_deref());
    let username = form.username.trim().to_string();
    // No operator has a longer name, and the name becomes a key of the throttle's table,
    // which a name of many kilobytes would overflow.
    if username.len() > rebound_queue::store::MAX_USERNAME_BYTES {
        return guard::refusal_page(StatusCode::BAD_REQUEST, "The username is too long: usernames have at most 64 bytes (64 letters of the Latin alphabet, fewer of others).");
    }
    let address = login_throttle::client_address(&headers, peer.as_ref().map(|p| &p.0), state.config.behind_proxy);
    let account = login_throttle::account_key(&username);
    let secure_cookie = secure(&state, &headers);
    // A browser this operator signed in from before is throttled by its own failures only,
    // and waits for turns strangers cannot take.
    let known_device = match device_token(&headers, secure_cookie) {
        None => None,
        Some(token) => match state.store.sign_in_device_operator(&hash_token(&token)).await {
            Ok(owner) => owner.filter(|owner| *owner == username).map(|_| token),
            Err(e) => {
                tracing::error!(error = %e, "login: looking up the device failed");
                return unavailable("the database is unavailable; try again shortly", 5);
            }
        },
    };
    let keys = match &known_device {
        Some(token) => vec![login_throttle::device_key(&hash_token(token))],
        None => {
            // The account first: a success forgets its failures and takes back the others'.
            let mut keys = vec![account.clone(), login_throttle::address_key(address)];
            keys.extend(login_throttle::network_key(address));
            keys
        }
    };
    // An attempt already throttled is refused before it waits for a turn at a password check,
    // so that a flood of them cannot hold the turns real sign-ins wait for. This look locks
    // and counts nothing; the locked one below decides for the attempts that pass it.
    match state.store.login_wait(&keys, login_throttle::FORGET_AFTER, login_throttle::remaining_wait).await {
        Ok(wait) if !wait.is_zero() => return throttled(&username, address, wait),
        Ok(_) => {}
        Err(e) => {
            tracing::error!(error = %e, "login: reading recent failures failed");
            return unavailable("the database is unavailable; try again shortly", 5);
        }
    }
    // argon2 takes ~19 MiB and tens of milliseconds per check: a bounded number run at once,
    // off the async workers; the rest wait their turn for a while, then are told to retry.
    // Taken before the attempt is counted: one told to retry was never checked.
    let turn = async {
        match &known_device {
            Some(_) => state.known_browser_turns.take(&username).await,
            None => Ok(vec![state.password_checks.clone().acquire_owned().await?]),
        }
    };
    let Ok(Ok(permit)) = tokio::time::timeout(PASSWORD_CHECK_QUEUE_WAIT, turn).await else {
        tracing::warn!(username = ?username, "login: too many password checks waiting");
        return unavailable("Too many sign-ins at once: try again in a few seconds.", 5);
    };
    let wait = match state.store.start_login_attempt(&keys, login_throttle::FORGET_AFTER, login_throttle::remaining_wait).await {
        Ok(wait) => wait,
        Err(e) => {
            tracing::error!(error = %e, "login: reading recent failures failed");
            return unavailable("the database is unavailable; try again shortly", 5);
        }
    };
    if !wait.is_zero() {
        return throttled(&username, address, wait);
    }
    let operator = match state.store.operator(&username).await {
        Ok(op) => op.filter(|op| !op.disabled),
        Err(e) => {
            tracing::error!(error = %e, "login: looking up the operator failed");
            return unavailable("the database is unavailable; try again shortly", 5);
        }
    };
    let hash = operator.as_ref().map(|op| op.password_hash.clone()).unwrap_or_else(|| DUMMY_HASH.to_string());
    let password = form.password;
    let matches = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        verify_password(&password, &hash)
    })
    .await
    .unwrap_or(false);
    let Some(operator) = operator.filter(|_| matches) else {
        // Already counted as a failure when the attempt started.
        tracing::info!(username = ?username, address = ?address, known_device = known_device.is_some(), "dashboard login refused");
        if let Some(token) = &known_device {
            // A browser that keeps failing (a stolen cookie, say) stops being known: its
            // next attempts are a stranger's, throttled by the account and the address.
            let hash = hash_token(token);
            let limit = i32::try_from(login_throttle::DEVICE_FAILURES).unwrap_or(i32::MAX);
            if let Err(e) = state.store.forget_failing_sign_in_device(&hash, &login_throttle::device_key(&hash), limit).await {
                tracing::warn!(error = %e, "login: forgetting a failing device failed");
            }
        }
        return see_other(&format!("/login?error=1&next={}", percent_encode(&next)));
    };
    // A known browser's success forgets only its own failures: the account's count is the
    // guessers', and resetting it would give them a fresh allowance.
    let succeeded = match &known_device {
        Some(token) => state.store.login_succeeded(&[login_throttle::device_key(&hash_token(token))], &[]).await,
        None => state.store.login_succeeded(std::slice::from_ref(&account), &keys[1..]).await,
    };
    if let Err(e) = succeeded {
        tracing::warn!(error = %e, "login: forgetting the account's failures failed");
    }
    // The browser's previous session ends: one sign-in, one session per browser, and a
    // session someone planted in the browser does not outlive the operator's own sign-in.
    if let Err(e) = end_sessions(&state, &session_tokens(&headers)).await {
        tracing::error!(error = %e, "login: ending the previous session failed");
        return unavailable("could not start a session; try again shortly", 5);
    }
    let (Ok(token), Ok(csrf)) = (random_secret(), random_secret()) else {
        tracing::error!("login: the OS gave no randomness for the session token");
        return unavailable("could not start a session; try again shortly", 5);
    };
    if let Err(e) = state.store.create_session(operator.id, &hash_token(&token), &csrf, SESSION_TTL).await {
        tracing::error!(error = %e, "login: creating the session failed");
        return unavailable("could not start a session; try again shortly", 5);
    }
    let actor = Actor::new(operator.username.clone());
    if let Err(e) = state.store.audit(&actor, "operator.login", Some(&operator.username), json!({})).await {
        tracing::warn!(error = %e, "login: writing the audit entry failed");
    }
    let mut res = see_other(&next);
    set_cookie(&mut res, &session_cookie(secure_cookie, &token, SESSION_TTL));
    if secure_cookie && cookie_value(&headers, SESSION_COOKIE).is_some() {
        clear_plain_session_cookie(&mut res);
    }
    remember_device(&state, &mut res, operator.id, known_device, secure_cookie).await;
    res
}

/// Marks the browser as one `operator_id` signed in from: renews the device token it
/// presented, or gives it a new one, and (re)sets its cookie. Failing to only costs the
/// browser the device lane next time.
async fn remember_device(state: &AppState, res: &mut Response, operator_id: i64, known: Option<String>, secure_cookie: bool) {
    let token = match known.map_or_else(random_secret, Ok) {
        Ok(token) => token,
        Err(e) => {
            tracing::warn!(error = %e, "login: the OS gave no randomness for a device token");
            return;
        }
    };
    match state.store.remember_sign_in_device(operator_id, &hash_token(&token), DEVICE_TTL, DEVICES_KEPT).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!("login: a new device token was already another operator's");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "login: remembering the browser failed");
            return;
        }
    }
    if let Ok(v) = HeaderValue::from_str(&device_cookie(secure_cookie, &token, DEVICE_TTL)) {
        guard::add_cookie(res, v);
    }
}

#[derive(Debug, Deserialize)]
pub struct LogoutForm {
    #[serde(default)]
    pub csrf: String,
}

/// `POST /auth/logout`: ends the session (the form's CSRF token must match it, so no other
/// site can sign an operator out), and any other the browser's session cookies name, and
/// clears the cookies.
pub async fn logout(State(state): State<AppState>, headers: HeaderMap, Form(form): Form<LogoutForm>) -> Response {
    let tokens = session_tokens(&headers);
    match resolve_session(&state, &tokens).await {
        Ok(Some(session)) if guard::constant_time_eq(session.csrf_token.as_bytes(), form.csrf.as_bytes()) => {
            if let Err(e) = end_sessions(&state, &tokens).await {
                tracing::error!(error = %e, "logout: deleting the session failed");
                return unavailable("could not end the session; try again", 5);
            }
            let who = &session.operator.username;
            if let Err(e) = state.store.audit(&Actor::new(who.clone()), "operator.logout", Some(who), json!({})).await {
                tracing::warn!(error = %e, "logout: writing the audit entry failed");
            }
        }
        Ok(Some(_)) => return guard::refusal_page(StatusCode::FORBIDDEN, &AppError::Csrf.to_string()),
        Ok(None) => {}
        Err(e) => {
            tracing::error!(error = %e, "logout: looking up the session failed");
            return unavailable("the database is unavailable; try again shortly", 5);
        }
    }
    let secure_cookie = secure(&state, &headers);
    let mut res = see_other("/login?logged_out=1");
    set_cookie(&mut res, &session_cookie(secure_cookie, "", Duration::ZERO));
    if secure_cookie {
        clear_plain_session_cookie(&mut res);
    }
    res
}

/// Paths anyone may load: the login page and its form handlers.
fn is_public(path: &str) -> bool {
    path == "/login" || path.starts_with("/auth/")
}

/// Every dashboard request: resolves the session cookie into a [`SignedIn`] request extension;
/// refuses cross-site, NUL-carrying or token-less mutations before anything parses them (see
/// [`dashboard_guard`](crate::dashboard_guard)); sends signed-out page loads to the login
/// page; drops server-function errors in links that this browser's form post did not
/// produce; gives server-function errors their status. Every answer is `Cache-Control:
/// no-store` unless it says otherwise: pages and server-function answers carry the session's
/// CSRF token and jobs' arguments, which no cache (the browser's own included) may keep. The
/// static files (`/pkg`) are outside this middleware and stay cacheable.
pub async fn session_middleware(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let mut res = guarded(state, req, next).await;
    res.headers_mut().entry(CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    res
}

/// When a dashboard form's body must have arrived: within the request timeout, but never
/// more than 30 s (the dashboard has no timeout of its own, and a sign-in's body is read
/// before anyone is known) nor less than a second.
fn form_deadline(request_timeout: std::time::Duration) -> tokio::time::Instant {
    let allowed = request_timeout.clamp(std::time::Duration::from_secs(1), request_body::DEFAULT_DEADLINE);
    tokio::time::Instant::now() + allowed
}

/// [`session_middleware`] but for the cache header.
async fn guarded(state: AppState, mut req: Request, next: Next) -> Response {
    let form_post = req.method() == Method::POST
        && req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/html"));
    let path = req.uri().path().to_string();
    let secure_cookies = secure(&state, req.headers());
    let unsafe_method = guard::is_unsafe(req.method());
    if unsafe_method && let Some(reason) = guard::cross_site(req.headers()) {
        tracing::warn!(path = %path, reason, "dashboard: cross-site request refused");
        return guard::refusal(StatusCode::FORBIDDEN, &AppError::Forbidden(format!("{reason}; use the dashboard's own forms")), form_post);
    }
    if !unsafe_method && guard::has_nul(req.uri().query().unwrap_or(""), b"") {
        let nul = AppError::Invalid { field: "query".into(), reason: "contains a NUL character".into() };
        return guard::refusal(StatusCode::BAD_REQUEST, &nul, true);
    }
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().cloned();
    let (session, stale_cookie) = match signed_in_session(&state, req.headers(), peer).await {
        Ok(found) => found,
        Err(e) => {
            tracing::error!(error = %e, "resolving the dashboard session failed");
            return unavailable("the database is unavailable; try again shortly", 5);
        }
    };
    if unsafe_method {
        // Refused before its body is read: a stranger's post must not hold the connection and
        // up to a form's worth of memory for as long as it cares to send.
        if guard::needs_csrf(&path) && session.is_none() {
            tracing::info!(path = %path, signed_in = false, "dashboard: mutation without a valid CSRF token refused");
            return guard::refusal(StatusCode::FORBIDDEN, &AppError::Csrf, form_post);
        }
        let (parts, body) = req.into_parts();
        let bytes = match request_body::within(form_deadline(state.config.request_timeout), axum::body::to_bytes(body, guard::MAX_FORM_BYTES)).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(_)) => {
                let too_big = AppError::Invalid { field: "body".into(), reason: format!("larger than {} KiB", guard::MAX_FORM_BYTES / 1024) };
                return guard::refusal(StatusCode::PAYLOAD_TOO_LARGE, &too_big, form_post);
            }
            Err(slow) => return guard::refusal(StatusCode::REQUEST_TIMEOUT, &AppError::Invalid { field: "body".into(), reason: slow.to_string() }, form_post),
        };
        if guard::needs_csrf(&path) {
            let sent = guard::form_field(&bytes, "csrf").unwrap_or_default();
            let ok = session.as_ref().is_some_and(|s| !sent.is_empty() && guard::constant_time_eq(sent.as_bytes(), s.csrf_token.as_bytes()));
            if !ok {
                tracing::info!(path = %path, signed_in = session.is_some(), "dashboard: mutation without a valid CSRF token refused");
                return guard::refusal(StatusCode::FORBIDDEN, &AppError::Csrf, form_post);
            }
        }
        if guard::has_nul(parts.uri.query().unwrap_or(""), &bytes) {
            let nul = AppError::Invalid { field: "form".into(), reason: "contains a NUL character".into() };
            return guard::refusal(StatusCode::BAD_REQUEST, &nul, form_post);
        }
        req = Request::from_parts(parts, Body::from(bytes));
    }
    let signed_in = session.is_some();
    if let Some(session) = session {
        req.extensions_mut().insert(SignedIn(session));
    }
    // A HEAD is a page load too: it renders the page, only the body is dropped.
    let is_page = matches!(*req.method(), Method::GET | Method::HEAD) && !path.starts_with("/api/");
    if is_page && !signed_in && !is_public(&path) {
        let target = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
        let mut res = see_other(&format!("/login?next={}", percent_encode(&target)));
        if stale_cookie {
            clear_stale_session_cookie(&mut res, secure_cookies);
        }
        return res;
    }
    let mut shown_flash = false;
    if is_page {
        match guard::check_flash(&path, req.uri().query(), req.headers(), secure_cookies) {
            FlashCheck::Absent => {}
            FlashCheck::Genuine => shown_flash = true,
            FlashCheck::Forged(clean) => {
                tracing::info!(path = %path, "dashboard: a server-function error in a link was dropped");
                return see_other(&clean);
            }
        }
    }
    let mut res = next.run(req).await;
    // Not on the sign-in paths, whose answers set the session cookie themselves.
    if stale_cookie && !is_public(&path) {
        clear_stale_session_cookie(&mut res, secure_cookies);
    }
    if shown_flash {
        guard::add_cookie(&mut res, guard::clear_flash_cookie(secure_cookies));
    }
    // A form post redirected back to a page whose error parameters were stripped leaves a
    // bare `?` behind.
    if let Some(location) = guard::location(&res) {
        let trimmed = location.strip_suffix('?').unwrap_or(&location).to_string();
        if trimmed != location
            && let Ok(v) = HeaderValue::from_str(&trimmed)
        {
            res.headers_mut().insert(LOCATION, v);
        }
        if form_post
            && path.starts_with("/api/")
            && let Some(cookie) = guard::flash_cookie_for(&trimmed, secure_cookies)
        {
            guard::add_cookie(&mut res, cookie);
        }
    }
    if path.starts_with("/api/") {
        res = guard::restatus_server_fn_error(res).await;
    }
    let status = res.status();
    if form_post && (status == StatusCode::FORBIDDEN || status == StatusCode::UNAUTHORIZED) {
        return refusal_page(res).await;
    }
    res
}

/// A server function's refusal of a plain form post (JavaScript off) as a page.
async fn refusal_page(res: Response) -> Response {
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 64 * 1024).await.unwrap_or_default();
    let message = serde_json::from_slice::<AppError>(&bytes)
        .map(|e| e.to_string())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    guard::refusal_page(status, &message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_session_cookie_among_others() {
        let mut h = HeaderMap::new();
        h.insert(COOKIE, HeaderValue::from_static("a=1; rebound_session=abc; b=2"));
        assert_eq!(cookie_value(&h, SESSION_COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie_value(&h, "missing"), None);
        h.insert(COOKIE, HeaderValue::from_static("rebound_session="));
        assert_eq!(cookie_value(&h, SESSION_COOKIE), None);
    }

    #[test]
    fn next_stays_on_this_site() {
        let table = [
            ("/jobs?state=retryable", "/jobs?state=retryable"),
            ("/jobs/0192?x=a%20b", "/jobs/0192?x=a%20b"),
            ("/a/../queues", "/queues"),
            ("//evil.example/", "/"),
            ("///evil.example/", "/"),
            ("https://evil.example/", "/"),
            ("javascript:alert(1)", "/"),
            ("/\\evil.example", "/"),
            ("/\t/evil.example", "/"),
            ("/\t\\evil.example", "/"),
            ("/\n/evil.example", "/"),
            ("/\r\n//evil.example", "/"),
            ("\t//evil.example", "/"),
            ("/%09/evil.example", "/%09/evil.example"),
            ("/%2F%2Fevil.example", "/%2F%2Fevil.example"),
            ("/\u{0}x", "/"),
            ("", "/"),
            ("evil.example", "/"),
            ("/@evil.example", "/@evil.example"),
        ];
        for (next, expected) in table {
            assert_eq!(safe_next(Some(next)), expected, "next = {next:?}");
        }
        assert_eq!(safe_next(None), "/");
    }

    #[test]
    fn the_cookie_is_http_only_and_same_site() {
        let c = session_cookie(false, "tok", SESSION_TTL);
        assert!(c.starts_with("rebound_session=tok; Path=/; HttpOnly; SameSite=Lax; Max-Age=43200"), "{c}");
        assert!(!c.contains("Secure"));
        let c = session_cookie(true, "tok", SESSION_TTL);
        assert!(c.starts_with("__Host-rebound_session=tok; Path=/; HttpOnly; SameSite=Lax; Max-Age=43200"), "{c}");
        assert!(c.ends_with("; Secure") && !c.to_lowercase().contains("domain="), "{c}");
    }

    #[test]
    fn the_host_prefixed_cookie_is_read_first_and_the_plain_one_still_counts() {
        let (old, new) = ("a1".repeat(32), "ef".repeat(32));
        let mut h = HeaderMap::new();
        let cookie = |v: String| HeaderValue::from_str(&v).expect("header");
        h.insert(COOKIE, cookie(format!("rebound_session={old}; __Host-rebound_session={new}")));
        assert_eq!(session_tokens(&h), [new.clone(), old.clone()]);
        h.insert(COOKIE, cookie(format!("rebound_session={old}")));
        assert_eq!(session_tokens(&h), std::slice::from_ref(&old));
        h.insert(COOKIE, cookie(format!("__Host-rebound_session={new}; other=x")));
        assert_eq!(session_tokens(&h), std::slice::from_ref(&new));
        h.insert(COOKIE, HeaderValue::from_static("other=x"));
        assert!(session_tokens(&h).is_empty());
        // What no sign-in wrote is no session, and is never looked up.
        for junk in ["x".to_string(), old[1..].to_string(), format!("{old}0"), old.to_uppercase(), format!("rbt_{old}")] {
            h.insert(COOKIE, cookie(format!("rebound_session={junk}; __Host-rebound_session={junk}")));
            assert!(session_tokens(&h).is_empty(), "{junk}");
            assert!(signing_in_token(&h, false).is_empty() && signing_in_token(&h, true).is_empty(), "{junk}");
        }
    }

    #[test]
    fn over_https_only_the_host_prefixed_cookie_signs_in() {
        let (planted, plain, host) = ("0b".repeat(32), "0c".repeat(32), "0d".repeat(32));
        let cookie = |v: String| HeaderValue::from_str(&v).expect("header");
        let mut h = HeaderMap::new();
        h.insert(COOKIE, cookie(format!("rebound_session={planted}")));
        assert!(signing_in_token(&h, true).is_empty(), "a plain cookie could have been planted");
        assert_eq!(signing_in_token(&h, false), [planted]);
        h.insert(COOKIE, cookie(format!("rebound_session={plain}; __Host-rebound_session={host}")));
        assert_eq!(signing_in_token(&h, true), [host]);
        assert_eq!(signing_in_token(&h, false), [plain]);
    }

    #[test]
    fn forwarded_proto_variants_count_only_behind_a_trusted_proxy() {
        let proto = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("x-forwarded-proto", HeaderValue::from_static(v));
            h
        };
        // (value, behind a trusted proxy, without one)
        let table = [
            ("https", true, true),
            ("HTTPS", true, false),
            (" Https ", true, false),
            ("https,http", true, false),
            ("https, http", true, false),
            ("http,https", false, false),
            ("http", false, false),
            ("", false, false),
            ("httpsx", false, false),
        ];
        for (value, trusted, untrusted) in table {
            assert_eq!(forwarded_https(&proto(value), true), trusted, "{value:?} behind a proxy");
            assert_eq!(forwarded_https(&proto(value), false), untrusted, "{value:?} without one");
        }
        assert!(!forwarded_https(&HeaderMap::new(), true));
    }

    #[test]
    fn the_dummy_hash_parses_and_matches_nothing() {
        assert!(argon2::password_hash::PasswordHash::new(DUMMY_HASH).is_ok());
        assert!(!verify_password("", DUMMY_HASH));
        assert!(!verify_password("password", DUMMY_HASH));
    }
}
