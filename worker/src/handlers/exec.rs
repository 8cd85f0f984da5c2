//! The `exec` handler: runs a configured command per job.
//!
//! The job's args go to the command's stdin as JSON; `REBOUND_JOB_ID`, `REBOUND_JOB_TYPE`,
//! `REBOUND_JOB_ATTEMPT` and `REBOUND_JOB_QUEUE` are set in its environment. Exit 0 completes
//! the job, with stdout as the result when it is JSON. Any other exit is a failure whose
//! outcome comes from the exit-code map (default: 75 `EX_TEMPFAIL` → retry; 64 `EX_USAGE` and
//! 65 `EX_DATAERR` → non-retryable; everything else → retry), whose error type names the
//! sysexits code (`exec.tempfail`, `exec.usage`, …, or `exec.exit`), and whose message is the
//! tail of stderr. The command is killed if the attempt times out or the worker gives up on it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;

use rebound_queue::{HandlerError, Outcome};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::handler::{Handler, HandlerFuture, HandlerResult, JobContext};

/// How much of stderr is kept for the error message.
const STDERR_TAIL_BYTES: usize = 2_000;
/// Stdout larger than this is not parsed as a result.
const MAX_RESULT_BYTES: usize = 1 << 20;

/// What a non-zero exit code means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitAction {
    /// Retry if the policy allows (the policy may still mark the error type non-retryable).
    Retry,
    /// End the job now by the policy's `on_exhaustion` (discard or dead letter).
    NonRetryable,
    Discard,
    DeadLetter,
    /// Permanent failure (terminal, like discard).
    Fail,
}

impl ExitAction {
    pub const NAMES: &'static str = "retry, non_retryable, discard, dead_letter or fail";

    pub fn parse(s: &str) -> Option<ExitAction> {
        Some(match s {
            "retry" => ExitAction::Retry,
            "non_retryable" => ExitAction::NonRetryable,
            "discard" => ExitAction::Discard,
            "dead_letter" => ExitAction::DeadLetter,
            "fail" => ExitAction::Fail,
            _ => return None,
        })
    }
}

/// Exit code → action. Codes not in the map retry.
#[derive(Clone, Debug, PartialEq)]
pub struct ExitCodeMap {
    actions: HashMap<i32, ExitAction>,
}

impl Default for ExitCodeMap {
    fn default() -> Self {
        let actions = HashMap::from([
            (75, ExitAction::Retry),        // EX_TEMPFAIL
            (64, ExitAction::NonRetryable), // EX_USAGE
            (65, ExitAction::NonRetryable), // EX_DATAERR
        ]);
        ExitCodeMap { actions }
    }
}

impl ExitCodeMap {
    /// The defaults with `entries` (`"code" → "action"`, as written in the config) on top.
    /// The error names the offending entry and says what is allowed.
    pub fn with_overrides(entries: &BTreeMap<String, String>) -> Result<ExitCodeMap, (String, String)> {
        let mut map = ExitCodeMap::default();
        for (code, action) in entries {
            let parsed: i32 = match code.parse() {
                Ok(c) if (1..=255).contains(&c) => c,
                _ => return Err((code.clone(), format!("{code:?} is not an exit code; use 1 to 255"))),
            };
            let Some(action) = ExitAction::parse(action) else {
                return Err((code.clone(), format!("unknown action {action:?}; use {}", ExitAction::NAMES)));
            };
            map.actions.insert(parsed, action);
        }
        Ok(map)
    }

    pub fn action_for(&self, code: i32) -> ExitAction {
        self.actions.get(&code).copied().unwrap_or(ExitAction::Retry)
    }

    /// The failure outcome of a command that exited with `code` (or was killed by `signal`).
    pub fn outcome_for_exit(&self, code: Option<i32>, signal: Option<i32>, stderr_tail: &str) -> Outcome {
        let (error_type, action, what) = match (code, signal) {
            (Some(c), _) => (format!("exec.{}", sysexits_name(c).unwrap_or("exit")), self.action_for(c), format!("exited with code {c}")),
            (None, Some(s)) => ("exec.signal".to_string(), ExitAction::Retry, format!("was killed by signal {s}")),
            (None, None) => ("exec.exit".to_string(), ExitAction::Retry, "ended without an exit code".to_string()),
        };
        let message = if stderr_tail.trim().is_empty() { format!("command {what}") } else { stderr_tail.trim().to_string() };
        let error = HandlerError::new(error_type, message).with_details(json!({
            "exit_code": code,
            "signal": signal,
            "stderr_tail": stderr_tail,
        }));
        match action {
            ExitAction::Retry => Outcome::Retry(error),
            ExitAction::NonRetryable => Outcome::Retry(error.non_retryable()),
            ExitAction::Discard => Outcome::Discard(error),
            ExitAction::DeadLetter => Outcome::DeadLetter(error),
            ExitAction::Fail => Outcome::Fail(error),
        }
    }
}

/// The `<sysexits.h>` name of a code, for error types such as `exec.tempfail`.
fn sysexits_name(code: i32) -> Option<&'static str> {
    Some(match code {
        64 => "usage",
        65 => "dataerr",
        66 => "noinput",
        67 => "nouser",
        68 => "nohost",
        69 => "unavailable",
        70 => "software",
        71 => "oserr",
        72 => "osfile",
        73 => "cantcreat",
        74 => "ioerr",
        75 => "tempfail",
        76 => "protocol",
        77 => "noperm",
        78 => "config",
        _ => return None,
    })
}

/// An `exec` handler's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecConfig {
    /// Program and arguments; no shell is involved unless the program is one.
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub working_dir: Option<PathBuf>,
    pub exit_codes: ExitCodeMap,
}

impl ExecConfig {
    pub fn new(command: Vec<String>) -> Self {
        ExecConfig { command, env: BTreeMap::new(), working_dir: None, exit_codes: ExitCodeMap::default() }
    }
}

pub struct ExecHandler {
    config: ExecConfig,
}

impl ExecHandler {
    pub fn new(config: ExecConfig) -> Self {
        ExecHandler { config }
    }

    async fn run(&self, job: JobContext) -> HandlerResult {
        let Some((program, args)) = self.config.command.split_first() else {
            return Err(Outcome::Retry(HandlerError::new("exec.spawn", "no command configured")));
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            // systemd's notification socket and watchdog belong to the worker, not its children.
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .envs(&self.config.env)
            .env("REBOUND_JOB_ID", job.id().to_string())
            .env("REBOUND_JOB_TYPE", job.job_type())
            .env("REBOUND_JOB_ATTEMPT", job.attempt().to_string())
            .env("REBOUND_JOB_QUEUE", job.queue());
        if let Some(dir) = &self.config.working_dir {
            cmd.current_dir(dir);
        }
        let mut child = cmd.spawn().map_err(|e| {
            Outcome::Retry(HandlerError::new("exec.spawn", format!("could not start {program:?}: {e}")).with_details(json!({"command": self.config.command})))
        })?;
        let input = serde_json::to_vec(job.args()).unwrap_or_else(|_| b"[]".to_vec());
        let stdin = child.stdin.take();
        let feed = async move {
            if let Some(mut stdin) = stdin {
                // A command that does not read its input closes the pipe early; that is fine.
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            }
        };
        let (_, output) = tokio::join!(feed, child.wait_with_output());
        let output = output.map_err(|e| Outcome::Retry(HandlerError::new("exec.io", format!("waiting for {program:?} failed: {e}"))))?;
        if output.status.success() {
            return Ok(result_from_stdout(&output.stdout));
        }
        let tail = tail_of(&output.stderr, STDERR_TAIL_BYTES);
        use std::os::unix::process::ExitStatusExt;
        Err(self.config.exit_codes.outcome_for_exit(output.status.code(), output.status.signal(), &tail))
    }
}

impl Handler for ExecHandler {
    fn handle(&self, job: JobContext) -> HandlerFuture<'_> {
        Box::pin(self.run(job))
    }
}

/// Stdout as the job's result: JSON if it parses, nothing otherwise.
fn result_from_stdout(stdout: &[u8]) -> Option<Value> {
    if stdout.len() > MAX_RESULT_BYTES {
        return None;
    }
    let text = std::str::from_utf8(stdout).ok()?.trim();
    if text.is_empty() {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// The last `max` bytes of `bytes` as text, starting at a character boundary.
fn tail_of(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let trimmed = text.trim_end();
    if trimmed.len() <= max {
        return trimmed.to_string();
    }
    let mut start = trimmed.len() - max;
    while !trimmed.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &trimmed[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(map: &ExitCodeMap, c: i32) -> Outcome {
        map.outcome_for_exit(Some(c), None, "boom\n")
    }

    #[test]
    fn default_exit_code_map() {
        let map = ExitCodeMap::default();
        match code(&map, 75) {
            Outcome::Retry(e) => {
                assert_eq!(e.error_type, "exec.tempfail");
                assert!(e.retryable);
                assert_eq!(e.message, "boom");
                assert_eq!(e.details.as_ref().unwrap()["exit_code"], 75);
            }
            other => panic!("{other:?}"),
        }
        for (c, t) in [(64, "exec.usage"), (65, "exec.dataerr")] {
            match code(&map, c) {
                Outcome::Retry(e) => {
                    assert_eq!(e.error_type, t);
                    assert!(!e.retryable, "{c} must be non-retryable");
                }
                other => panic!("{other:?}"),
            }
        }
        for (c, t) in [(1, "exec.exit"), (70, "exec.software"), (255, "exec.exit")] {
            match code(&map, c) {
                Outcome::Retry(e) => {
                    assert_eq!(e.error_type, t);
                    assert!(e.retryable);
                }
                other => panic!("{other:?}"),
            }
        }
        match map.outcome_for_exit(None, Some(9), "") {
            Outcome::Retry(e) => {
                assert_eq!(e.error_type, "exec.signal");
                assert_eq!(e.message, "command was killed by signal 9");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn configured_overrides() {
        let entries = BTreeMap::from([
            ("75".to_string(), "dead_letter".to_string()),
            ("3".to_string(), "discard".to_string()),
            ("4".to_string(), "fail".to_string()),
            ("5".to_string(), "non_retryable".to_string()),
        ]);
        let map = ExitCodeMap::with_overrides(&entries).unwrap();
        assert!(matches!(code(&map, 75), Outcome::DeadLetter(_)));
        assert!(matches!(code(&map, 3), Outcome::Discard(_)));
        assert!(matches!(code(&map, 4), Outcome::Fail(_)));
        assert!(matches!(code(&map, 5), Outcome::Retry(e) if !e.retryable));
        // The defaults not overridden stay.
        assert!(matches!(code(&map, 65), Outcome::Retry(e) if !e.retryable));

        let bad_code = BTreeMap::from([("x1".to_string(), "retry".to_string())]);
        assert_eq!(ExitCodeMap::with_overrides(&bad_code).unwrap_err().0, "x1");
        let zero = BTreeMap::from([("0".to_string(), "retry".to_string())]);
        assert!(ExitCodeMap::with_overrides(&zero).is_err());
        let bad_action = BTreeMap::from([("7".to_string(), "explode".to_string())]);
        let (key, reason) = ExitCodeMap::with_overrides(&bad_action).unwrap_err();
        assert_eq!(key, "7");
        assert!(reason.contains("explode") && reason.contains("dead_letter"), "{reason}");
    }

    #[test]
    fn stderr_tail_keeps_the_end_on_a_char_boundary() {
        let long = format!("{}é{}", "a".repeat(3000), "z".repeat(10));
        let tail = tail_of(long.as_bytes(), 11);
        assert!(tail.ends_with("zzzzzzzzzz"));
        assert!(tail.starts_with('…'));
        assert_eq!(tail_of(b"short\n", 100), "short");
    }

    fn job(args: Value) -> JobContext {
        crate::handler::test_context("exec.test", args, 2)
    }

    fn sh(script: &str) -> ExecHandler {
        ExecHandler::new(ExecConfig::new(vec!["sh".into(), "-c".into(), script.into()]))
    }

    #[tokio::test]
    async fn args_on_stdin_job_in_env_and_json_stdout_as_result() {
        let ctx = job(json!([{"to": "ada@example.com"}, 2]));
        let id = ctx.id();
        let h = sh(r#"read -r input; printf '{"input": %s, "id": "%s", "type": "%s", "attempt": %s}' "$input" "$REBOUND_JOB_ID" "$REBOUND_JOB_TYPE" "$REBOUND_JOB_ATTEMPT""#);
        let result = h.handle(ctx).await.unwrap().unwrap();
        assert_eq!(result["input"], json!([{"to": "ada@example.com"}, 2]));
        assert_eq!(result["id"], id.to_string());
        assert_eq!(result["type"], "exec.test");
        assert_eq!(result["attempt"], 2);

        assert_eq!(sh("echo not json").handle(job(json!([]))).await.unwrap(), None);
        assert_eq!(sh("true").handle(job(json!([]))).await.unwrap(), None);
    }

    #[tokio::test]
    async fn failing_commands_map_through_the_exit_codes() {
        let err = sh("echo 'bad input: no recipient' >&2; exit 65").handle(job(json!([]))).await.unwrap_err();
        match err {
            Outcome::Retry(e) => {
                assert_eq!(e.error_type, "exec.dataerr");
                assert!(!e.retryable);
                assert_eq!(e.message, "bad input: no recipient");
            }
            other => panic!("{other:?}"),
        }
        let err = sh("exit 75").handle(job(json!([]))).await.unwrap_err();
        assert!(matches!(err, Outcome::Retry(e) if e.retryable && e.error_type == "exec.tempfail" && e.message == "command exited with code 75"));
        let missing = ExecHandler::new(ExecConfig::new(vec!["/nonexistent/rebound-test".into()]));
        let err = missing.handle(job(json!([]))).await.unwrap_err();
        assert!(matches!(err, Outcome::Retry(e) if e.error_type == "exec.spawn"));
    }

    #[tokio::test]
    async fn dropping_the_attempt_kills_the_command() {
        let dir = std::env::temp_dir().join(format!("rebound-exec-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let marker = dir.join("still-running");
        let h = sh(&format!("sleep 1; touch {}", marker.display()));
        let attempt = h.handle(job(json!([])));
        assert!(tokio::time::timeout(std::time::Duration::from_millis(100), attempt).await.is_err());
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        assert!(!marker.exists(), "the command outlived its attempt");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
